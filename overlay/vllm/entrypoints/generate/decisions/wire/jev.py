# SPDX-License-Identifier: Apache-2.0
"""``POST /v1/systemone``: TypeSafe's Jev System One format, translated to and from the service.

Jev clients send their own top-level extras, so unknown top-level fields are ignored; unknown
fields inside a question are refused, since a misspelled field could change an answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import DecisionError
from ..questions import CompiledQuestion, content_text, rendering_limit
from ..registry import built_in_question_type, failures_note, question_type
from ..service import Answer, Decision, DecisionService
from ..validation import detail_message, is_field_name
from .common import ExtraRequest, answer_extra, decide, response_id


class JevValidationError(DecisionError):
    """A request Jev clients should see as a 422 with FastAPI-style ``detail`` entries."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail_message(detail))
        self.detail = detail

    @classmethod
    def at(cls, loc: tuple[Any, ...], msg: str, kind: str = "value_error") -> JevValidationError:
        return cls([{"loc": ["body", *loc], "msg": msg, "type": kind}])

    @classmethod
    def from_pydantic(cls, exc: ValidationError, loc: tuple[Any, ...] = ()) -> JevValidationError:
        detail: list[dict[str, Any]] = []
        for e in exc.errors(include_url=False):
            entry = {
                "loc": ["body", *loc, *(p for p in e["loc"] if is_field_name(p))],
                "msg": e["msg"],
                "type": e["type"],
            }
            if entry not in detail:
                detail.append(entry)
        return cls(detail)


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Any = None  # Jev clients name their own models (jev-latest); the served model answers
    state: str | dict[str, Any] | list[Any]
    questions: dict[str, Any] = Field(min_length=1)
    backend: str | None = None
    extra: ExtraRequest = Field(default_factory=ExtraRequest)


# Jev's image-only question type: known, but not answerable by a text model.
IMAGE_ONLY_TYPES = {"box": "box questions locate a region in an image; this server's model reads text only"}


def compile_question(question_id: str, raw: Any) -> CompiledQuestion:
    if not isinstance(raw, dict):
        raise JevValidationError.at(("questions", question_id), "a question must be an object")
    kind = raw.get("type")
    if isinstance(kind, str) and kind in IMAGE_ONLY_TYPES:
        raise JevValidationError.at(("questions", question_id, "type"), IMAGE_ONLY_TYPES[kind])
    qtype = question_type(kind) if isinstance(kind, str) else None
    if qtype is None:
        raise JevValidationError.at(
            ("questions", question_id, "type"), f"unknown question type {kind!r}" + failures_note()
        )
    try:
        return qtype.compile(qtype.model.model_validate(raw))
    except ValidationError as exc:
        raise JevValidationError.from_pydantic(exc, ("questions", question_id)) from None


def parse_request(body: Any) -> tuple[SystemOneRequest, str, list[str], list[CompiledQuestion]]:
    try:
        request = SystemOneRequest.model_validate(body)
    except ValidationError as exc:
        raise JevValidationError.from_pydantic(exc) from None
    if request.backend is not None:
        if request.extra.backend is not None:
            raise JevValidationError.at(("backend",), "send backend at the top level or under extra, not both")
        request.extra.backend = request.backend
    ids = list(request.questions)
    return request, content_text(request.state), ids, [compile_question(i, request.questions[i]) for i in ids]


def noul_answer(answer: Answer) -> dict[str, Any]:
    return {"noul": answer.fields["probability"]}


def choice_answer(answer: Answer) -> dict[str, Any]:
    options, probabilities = answer.question.options, answer.probabilities
    return {
        "choice": answer.fields["choice"],
        "probabilities": {str(o.value): p for o, p in zip(options, probabilities, strict=True)},
        "confidence": answer.confidence,
    }


def score_answer(answer: Answer) -> dict[str, Any]:
    options, probabilities = answer.question.options, answer.probabilities
    return {
        "score": answer.fields["score"],
        "confidence": answer.confidence,
        "legend": {o.key: o.label for o in options},
        "probabilities": {o.key: p for o, p in zip(options, probabilities, strict=True)},
    }


# Jev's answer shape for each of its own question types; any other type's answer goes out whole.
ANSWER_SHAPES = {"noul": noul_answer, "choice": choice_answer, "score": score_answer}


def answer_json(answer: Answer, detail: str) -> dict[str, Any]:
    qtype = answer.question.qtype
    shape = ANSWER_SHAPES.get(qtype.name) if built_in_question_type(qtype.name) else None
    if shape is not None:
        result = {"type": qtype.name, **shape(answer)}
    else:
        probabilities = {o.key: p for o, p in zip(answer.question.options, answer.probabilities, strict=True)}
        result = {"type": qtype.name, "probabilities": probabilities, **answer.fields, "confidence": answer.confidence}
    extra = answer_extra(answer, detail)  # type: ignore[arg-type]
    if extra is not None:
        result["extra"] = extra
    return result


def response_json(request: SystemOneRequest, ids: list[str], decision: Decision) -> dict[str, Any]:
    answers, failures = {}, {}
    for question_id, result in zip(ids, decision.results, strict=True):
        if isinstance(result, Answer):
            answers[question_id] = answer_json(result, request.extra.detail)
        else:
            failures[question_id] = result.error.message
    response_id_, created = response_id("systemone")
    body: dict[str, Any] = {
        "id": response_id_,
        "created": created,
        "model": decision.served_model,
        "answers": answers,
        "usage": {"input_tokens": decision.input_tokens, "output_tokens": len(answers)},
    }
    if failures:
        body["partial_failures"] = failures
    return body


async def create_systemone(service: DecisionService, body: Any, request_id: str) -> dict[str, Any]:
    with rendering_limit(service.settings.max_input_chars):
        request, state, ids, questions = parse_request(body)
    where = [f"questions.{question_id}" for question_id in ids]
    decision = await decide(service, request.extra, state, questions, where, request_id)
    return response_json(request, ids, decision)
