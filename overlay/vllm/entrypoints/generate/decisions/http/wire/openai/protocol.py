# SPDX-License-Identifier: Apache-2.0
"""OpenAI's Decisions request and response bodies (``POST /v1/decisions``). Requests are strict (a typo
could change an answer); questions and input items are validated one by one in serving.py, so plugin
types can join at startup and each error names its place (``questions[2].choices``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictStr, field_validator

from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    built_in_question_type,
    question_type,
    question_type_names,
)
from vllm.entrypoints.generate.decisions.http.wire.common import (
    AnswerExtra,
    ExtraRequest,
    schema_of,
)
from vllm.entrypoints.generate.decisions.http.wire.openai.input import (
    INPUT_ITEM,
    QuestionPart,
    Strict,
)

Instructions = str | list[QuestionPart]


class Named(Strict):
    # A default that is never validated: absent means unnamed, an explicit null is refused.
    name: StrictStr = Field(default=None)  # type: ignore[assignment]
    instructions: Instructions


class PredicateQuestion(Named):
    type: Literal["predicate"]


class Choice(Strict):
    value: StrictStr | StrictBool
    description: str | None = None


class ChoiceQuestion(Named):
    type: Literal["choice"]
    choices: list[Choice] = Field(min_length=2)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, choices: list[Choice]) -> list[Choice]:
        seen = [(type(c.value), c.value) for c in choices]
        if len(set(seen)) != len(seen):
            raise ValueError(
                "choice values must be distinct (a string and a boolean with the same text differ)"
            )
        return choices


class Level(Strict):
    label: str
    description: str | None = None


class ScoreQuestion(Named):
    type: Literal["score"]
    levels: list[Level] = Field(min_length=2)


BUILT_IN: dict[str, type[Named]] = {
    "predicate": PredicateQuestion,
    "choice": ChoiceQuestion,
    "score": ScoreQuestion,
}


def registered_questions(schema: dict[str, Any]) -> None:
    """OpenAI's three question types, then each plugin type with an optional ``name``, filled in once
    the plugins have loaded."""
    questions = [schema_of(model) for model in BUILT_IN.values()]
    for name in question_type_names():
        qtype = None if built_in_question_type(name) else question_type(name)
        if qtype is not None:
            own = schema_of(qtype.model)
            properties = {"name": {"type": "string"}, **own.get("properties", {})}
            questions.append({**own, "properties": properties})
    schema["items"] = {"anyOf": questions}


def input_items(schema: dict[str, Any]) -> None:
    schema["anyOf"] = [
        {"type": "string"},
        {"type": "array", "items": schema_of(INPUT_ITEM)},
    ]


class PromptCacheOptions(Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class DecisionsRequest(Strict):
    model: str
    input: str | list[Any] = Field(json_schema_extra=input_items)
    questions: list[Any] = Field(min_length=1, json_schema_extra=registered_questions)
    # OpenAI's caching and safety fields: accepted, with no effect here (vLLM's prefix cache is
    # automatic and this server keeps no per-user state).
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    extra: ExtraRequest = Field(default_factory=ExtraRequest)


class PredicateAnswer(BaseModel):
    name: str | None
    type: Literal["predicate"]
    probability: float
    extra: AnswerExtra | None = None


class ChoiceProbability(BaseModel):
    value: str | bool
    probability: float


class ChoiceAnswer(BaseModel):
    name: str | None
    type: Literal["choice"]
    choice: str | bool
    probabilities: list[ChoiceProbability]
    confidence: float
    extra: AnswerExtra | None = None


class LevelProbability(BaseModel):
    label: str
    value: Any
    probability: float


class ScoreAnswer(BaseModel):
    name: str | None
    type: Literal["score"]
    score: float
    probabilities: list[LevelProbability]
    confidence: float
    extra: AnswerExtra | None = None


class PluginAnswer(BaseModel):
    """A registered plugin type's answer: its own fields beside these."""

    model_config = {"extra": "allow"}

    name: str | None
    type: str
    confidence: float
    probabilities: Any  # by option key, unless the type reports its own
    extra: AnswerExtra | None = None


class RefusalExtra(BaseModel):
    error: str


class Refusal(BaseModel):
    """A question that could not be answered, beside the answers of the others."""

    type: Literal["refusal"]
    name: str | None
    extra: RefusalExtra


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseExtra(BaseModel):
    id: str
    created: int


class DecisionsResponse(BaseModel):
    model: str
    answers: list[PredicateAnswer | ChoiceAnswer | ScoreAnswer | PluginAnswer | Refusal]
    usage: Usage
    extra: ResponseExtra
