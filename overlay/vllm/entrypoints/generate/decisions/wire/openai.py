# SPDX-License-Identifier: Apache-2.0
"""``POST /v1/decisions``: OpenAI's Decisions format, translated to and from the decision service.

A predicate is read as a yes/no ``noul`` without criteria, a choice as a ``choice``, a score as a
``score``, so each renders exactly as the same Jev question does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictStr, ValidationError, field_validator

from ..errors import DecisionError
from ..questions import (
    CHOICE,
    NOUL,
    SCORE,
    CompiledQuestion,
    NoulQuestion,
    choice_options,
    level_options,
    rendering_limit,
)
from ..registry import built_in_question_type, failures_note, question_type
from ..service import Answer, Decision, DecisionService
from ..validation import validation_message
from .common import ExtraRequest, answer_extra, decide, response_id
from .openai_input import QuestionPart, Strict, parse_items, parts_text, render_input

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
            raise ValueError("choice values must be distinct (a string and a boolean with the same text differ)")
        return choices


class Level(Strict):
    label: str
    description: str | None = None


class ScoreQuestion(Named):
    type: Literal["score"]
    levels: list[Level] = Field(min_length=2)


BUILT_IN: dict[str, type[Named]] = {"predicate": PredicateQuestion, "choice": ChoiceQuestion, "score": ScoreQuestion}


class PromptCacheOptions(Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class DecisionsRequest(Strict):
    model: str
    input: str | list[Any]
    questions: list[Any] = Field(min_length=1)
    # OpenAI's caching and safety fields: accepted, with no effect here (vLLM's prefix cache is
    # automatic and this server keeps no per-user state).
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    extra: ExtraRequest = Field(default_factory=ExtraRequest)


def input_text(value: str | list[Any]) -> str:
    """The input as one text: a string as it is, input items rendered in order."""
    return value if isinstance(value, str) else render_input(parse_items(value))


def compile_question(index: int, raw: Any) -> tuple[str | None, CompiledQuestion]:
    """One question of the request as (its name, the compiled question).

    OpenAI's three types are built in; any other registered type is a plugin question (Jev's own
    types are not: ``predicate`` is the yes/no type here).
    """
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in BUILT_IN:
        return compile_plugin_question(index, raw)
    try:
        question = BUILT_IN[kind].model_validate(raw)
    except ValidationError as exc:
        raise DecisionError(validation_message(exc, f"questions[{index}]")) from None
    text = parts_text(question.instructions, f"questions[{index}].instructions")
    if isinstance(question, PredicateQuestion):
        return question.name, NOUL.compile(NoulQuestion(instructions=text))
    if isinstance(question, ChoiceQuestion):
        options = choice_options([(c.value, c.description) for c in question.choices])
        return question.name, CompiledQuestion(CHOICE, text, options)
    assert isinstance(question, ScoreQuestion)
    options = level_options([(level.label, level.description) for level in question.levels])
    return question.name, CompiledQuestion(SCORE, text, options)


def compile_plugin_question(index: int, raw: Any) -> tuple[str | None, CompiledQuestion]:
    if not isinstance(raw, dict):
        raise DecisionError(f"questions[{index}]: must be an object")
    kind = raw.get("type")
    qtype = question_type(kind) if isinstance(kind, str) else None
    if qtype is None or built_in_question_type(qtype.name):
        raise DecisionError(f"questions[{index}].type: unknown question type {kind!r}" + failures_note())
    name = raw.get("name")
    if "name" in raw and not isinstance(name, str):
        raise DecisionError(f"questions[{index}].name: must be a string when given")
    try:
        question = qtype.model.model_validate({k: v for k, v in raw.items() if k != "name"})
    except ValidationError as exc:
        raise DecisionError(validation_message(exc, f"questions[{index}]")) from None
    return name, qtype.compile(question)


def parse_request(body: Any) -> tuple[DecisionsRequest, str, list[str | None], list[CompiledQuestion]]:
    try:
        request = DecisionsRequest.model_validate(body)
    except ValidationError as exc:
        raise DecisionError(validation_message(exc)) from None
    state = input_text(request.input)
    named = [compile_question(i, q) for i, q in enumerate(request.questions)]
    return request, state, [n for n, _ in named], [q for _, q in named]


def predicate_answer(answer: Answer) -> dict[str, Any]:
    return {"type": "predicate", "probability": answer.fields["probability"]}


def choice_answer(answer: Answer) -> dict[str, Any]:
    options, probabilities = answer.question.options, answer.probabilities
    return {
        "type": "choice",
        "choice": answer.fields["choice"],
        "probabilities": [{"value": o.value, "probability": p} for o, p in zip(options, probabilities, strict=True)],
        "confidence": answer.confidence,
    }


def score_answer(answer: Answer) -> dict[str, Any]:
    options, probabilities = answer.question.options, answer.probabilities
    return {
        "type": "score",
        "score": answer.fields["score"],
        "probabilities": [
            {"label": o.label, "value": o.value, "probability": p} for o, p in zip(options, probabilities, strict=True)
        ],
        "confidence": answer.confidence,
    }


def plugin_answer(answer: Answer) -> dict[str, Any]:
    """A plugin type's answer, whole: its own fields, the confidence and (unless it has its own) the
    probabilities by option key."""
    options, probabilities = answer.question.options, answer.probabilities
    fields = {"type": answer.question.qtype.name, **answer.fields, "confidence": answer.confidence}
    fields.setdefault("probabilities", {o.key: p for o, p in zip(options, probabilities, strict=True)})
    return fields


# OpenAI's answer shape for each built-in question type (compiled from predicate, choice and score).
ANSWER_SHAPES = {"noul": predicate_answer, "choice": choice_answer, "score": score_answer}


def answer_json(name: str | None, answer: Answer, detail: str) -> dict[str, Any]:
    kind = answer.question.qtype.name
    shape = ANSWER_SHAPES.get(kind) if built_in_question_type(kind) else None
    result = {"name": name, **(shape or plugin_answer)(answer)}
    extra = answer_extra(answer, detail)  # type: ignore[arg-type]
    if extra is not None:
        result["extra"] = extra
    return result


def response_json(request: DecisionsRequest, names: list[str | None], decision: Decision) -> dict[str, Any]:
    answers = []
    for name, result in zip(names, decision.results, strict=True):
        if isinstance(result, Answer):
            answers.append(answer_json(name, result, request.extra.detail))
        else:
            answers.append({"type": "refusal", "name": name, "extra": {"error": result.error.message}})
    response_id_, created = response_id("decisions")
    input_tokens = decision.input_tokens
    return {
        "model": decision.served_model,
        "answers": answers,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": decision.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens,
        },
        "extra": {"id": response_id_, "created": created},
    }


async def create_decision(service: DecisionService, body: Any, request_id: str) -> dict[str, Any]:
    with rendering_limit(service.settings.max_input_chars):
        request, state, names, questions = parse_request(body)
    where = [f"questions[{i}]" for i in range(len(questions))]
    decision = await decide(service, request.extra, state, questions, where, request_id)
    return response_json(request, names, decision)


__all__ = ["create_decision"]
