# SPDX-License-Identifier: Apache-2.0
"""Jev System One's request and response bodies (``POST /v1/systemone``, ``/api/alpha/decisions``).

Jev clients send their own top-level extras, so unknown top-level fields are ignored; unknown
fields inside a question are refused by the question type's own model, since a misspelled field
could change an answer. vLLM 0.32's own ``/v1/systemone`` (which this route answers in its place) takes
``cache_salt`` and ``priority`` at the top level, as vLLM's APIs take their extensions: so do we (or
under ``extra``). Its ``instructions``, ``images``, ``audio`` and ``videos`` would change what is read, so
they are refused rather than ignored (docs/upstream-systemone.md). Responses leave out what wasn't set (``extra`` at ``detail: none``,
``partial_failures`` when every question was answered).
"""

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
    """Each registered question type's model, plugins' included: filled in when the OpenAPI document is
    first built, after the plugins have loaded."""
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
    # vLLM 0.32's own /v1/systemone fields that we don't take: read here only to refuse them (serving.py),
    # and left out of the OpenAPI document.
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
