# SPDX-License-Identifier: Apache-2.0
"""Jev System One's request and response bodies. Unknown top-level fields are ignored (Jev clients send
their own); a question's are refused by its type's model, as a typo could change an answer. Of vLLM
0.32's own ``/v1/systemone`` fields, ``instructions`` and media are refused (docs/upstream-systemone.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    question_type,
    question_type_names,
)
from vllm.entrypoints.generate.decisions.http.wire.common import (
    AnswerExtra,
    CacheSalt,
    ExtraRequest,
    Priority,
    schema_of,
)


def registered_questions(schema: dict[str, Any]) -> None:
    """Each registered question type's model, filled in once the plugins have loaded."""
    types = [question_type(name) for name in question_type_names()]
    schema["additionalProperties"] = {
        "anyOf": [schema_of(qtype.model) for qtype in types if qtype is not None]
    }


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Any = None  # a name GET /v1/models lists: the served model or a LoRA adapter (adapters.py)
    state: str | dict[str, Any] | list[Any]
    # Question id -> question; each validated by its type's model (registered types, plugins too).
    questions: dict[str, Any] = Field(
        min_length=1, json_schema_extra=registered_questions
    )
    backend: str | None = None
    # vLLM extensions, at the top level or under extra (not both).
    cache_salt: CacheSalt | None = None
    priority: Priority | None = None
    extra: ExtraRequest = Field(default_factory=ExtraRequest)
    # vLLM 0.32's /v1/systemone fields: read only to refuse them (serving.py)
    instructions: SkipJsonSchema[Any] = None
    images: SkipJsonSchema[Any] = None
    audio: SkipJsonSchema[Any] = None
    videos: SkipJsonSchema[Any] = None


class NoulAnswer(BaseModel):
    type: Literal["noul"]
    noul: float
    extra: AnswerExtra | None = None


class ChoiceAnswer(BaseModel):
    type: Literal["choice"]
    choice: Any
    probabilities: dict[str, float]
    confidence: float
    extra: AnswerExtra | None = None


class ScoreAnswer(BaseModel):
    type: Literal["score"]
    score: float
    confidence: float
    legend: dict[str, str]
    probabilities: dict[str, float]
    extra: AnswerExtra | None = None


class PluginAnswer(BaseModel):
    """A registered plugin type's answer: its own fields beside these."""

    model_config = ConfigDict(extra="allow")

    type: str
    probabilities: Any  # by option key, unless the type reports its own
    confidence: float
    extra: AnswerExtra | None = None


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int  # questions answered


class SystemOneResponse(BaseModel):
    id: str
    created: int
    model: str
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer | PluginAnswer]
    usage: Usage
    # Question id -> why it wasn't answered; absent when every question was.
    partial_failures: dict[str, str] | None = None


class JevErrorDetail(BaseModel):
    error_type: str
    message: str


class JevError(BaseModel):
    """A refusal other than a validation error, in Jev's shape."""

    detail: JevErrorDetail


class JevValidationDetail(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class JevValidationErrors(BaseModel):
    """A 422: FastAPI-style entries, one per problem."""

    detail: list[JevValidationDetail]
