# SPDX-License-Identifier: Apache-2.0
"""Serving ``POST /v1/systemone``: a :class:`SystemOneRequest` compiled to questions for the decision
service, and its decision shaped as a :class:`SystemOneResponse`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from vllm.entrypoints.generate.decisions.decide.answers import Answer, Decision
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    built_in_question_type,
    failures_note,
    question_type,
)
from vllm.entrypoints.generate.decisions.decide.budget import RenderBudget
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError, shown
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    content_text,
)
from vllm.entrypoints.generate.decisions.decide.serving.request import DecisionRequest
from vllm.entrypoints.generate.decisions.decide.serving.service import (
    check_option_count,
    check_question_count,
)
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.validation import (
    detail_message,
    is_field_name,
    loc_part,
)
from vllm.entrypoints.generate.decisions.http.wire.common import (
    answer_of,
    by_key,
    decision_request,
    option_probabilities,
    plugin_fields,
    response_id,
    serving,
)
from vllm.entrypoints.generate.decisions.http.wire.handling import body_errors
from vllm.entrypoints.generate.decisions.http.wire.jev.protocol import (
    ChoiceAnswer,
    NoulAnswer,
    PluginAnswer,
    ScoreAnswer,
    SystemOneRequest,
    SystemOneResponse,
    Usage,
)


class JevValidationError(DecisionError):
    """A request Jev clients should see as a 422 with FastAPI-style ``detail`` entries; a location's
    client keys (question ids, unknown field names) cut short, as messages quote client values."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        detail = [{**d, "loc": [loc_part(p) for p in d["loc"]]} for d in detail]
        super().__init__(detail_message(detail))
        self.detail = detail

    @classmethod
    def at(
        cls, loc: tuple[Any, ...], msg: str, kind: str = "value_error"
    ) -> JevValidationError:
        return cls([{"loc": ["body", *loc], "msg": msg, "type": kind}])

    @classmethod
    def from_errors(
        cls, errors: list[dict[str, Any]], loc: tuple[Any, ...] = ()
    ) -> JevValidationError:
        """FastAPI-style body errors (handling.body_errors) as Jev's entries, placed under ``loc``."""
        detail: list[dict[str, Any]] = []
        for e in errors:
            path = [p for p in e["loc"][1:] if is_field_name(p)]
            if (entry := {**e, "loc": ["body", *loc, *path]}) not in detail:
                detail.append(entry)
        return cls(detail)


# The model Jev clients name unless told otherwise (the TypeSafe SDK's default, the specification's
# example): here, whatever base model the server serves. Other names are checked as vLLM checks them.
JEV_LATEST = "jev-latest"

# Jev's image-only question type: known, but not answerable by a text model.
IMAGE_ONLY_TYPES = {
    "box": "box questions locate a region in an image; this server's model reads text only"
}


def question_name(question_id: str) -> str:
    """How messages name a question: ``questions.<id>``, a long id cut short."""
    return f"questions.{shown(question_id, bare=True)}"


def compile_question(
    question_id: str, raw: Any, settings: Settings, budget: RenderBudget
) -> CompiledQuestion:
    if not isinstance(raw, dict):
        raise JevValidationError.at(
            ("questions", question_id), "a question must be an object"
        )
    kind = raw.get("type")
    if isinstance(kind, str) and kind in IMAGE_ONLY_TYPES:
        raise JevValidationError.at(
            ("questions", question_id, "type"), IMAGE_ONLY_TYPES[kind]
        )
    qtype = question_type(kind) if isinstance(kind, str) else None
    if qtype is None:
        raise JevValidationError.at(
            ("questions", question_id, "type"),
            f"unknown question type {shown(kind)}" + failures_note(),
        )
    if built_in_question_type(qtype) and isinstance(
        criteria := raw.get("criteria"), (dict, list)
    ):
        check_option_count(settings, qtype, len(criteria), question_name(question_id))
    try:
        validated = qtype.model.model_validate(raw)
    except ValidationError as exc:
        raise JevValidationError.from_errors(
            body_errors(exc), ("questions", question_id)
        ) from None
    return qtype.compile(validated, budget)


# vLLM 0.32's own /v1/systemone takes these; we refuse them rather than answer without them.
NOT_TAKEN = {
    "instructions": "a top-level instructions field is not taken here: each question is read with its own "
    "instructions; put shared context in the state or in each question's instructions",
    "images": "image inputs are not taken here: decisions read the state as text",
    "audio": "audio inputs are not taken here: decisions read the state as text",
    "videos": "video inputs are not taken here: decisions read the state as text",
}


def compiled(
    request: SystemOneRequest, request_id: str, settings: Settings
) -> tuple[list[str], DecisionRequest]:
    for name, reason in NOT_TAKEN.items():
        if getattr(request, name) not in (None, "", [], {}):
            raise JevValidationError.at((name,), reason)
    for name in ("backend", "cache_salt", "priority"):
        if (value := getattr(request, name)) is not None:
            if getattr(request.extra, name) is not None:
                raise JevValidationError.at(
                    (name,), f"send {name} at the top level or under extra, not both"
                )
            setattr(request.extra, name, value)
    if request.model is not None and not isinstance(request.model, str):
        raise JevValidationError.at(
            ("model",), "model must be a string: a name GET /v1/models lists"
        )
    ids = list(request.questions)
    check_question_count(settings, len(ids))
    budget = RenderBudget.of(settings)
    questions = [
        compile_question(i, request.questions[i], settings, budget) for i in ids
    ]
    state = content_text(request.state, budget)
    where = [question_name(question_id) for question_id in ids]
    model = None if request.model == JEV_LATEST else request.model
    return ids, decision_request(
        request.extra, state, questions, where, request_id, model
    )


def noul_answer(answer: Answer) -> NoulAnswer:
    return NoulAnswer(type="noul", noul=answer.fields["probability"])


def choice_answer(answer: Answer) -> ChoiceAnswer:
    return ChoiceAnswer(
        type="choice",
        choice=answer.fields["choice"],
        probabilities={str(o.value): p for o, p in option_probabilities(answer)},
        confidence=answer.confidence,
    )


def score_answer(answer: Answer) -> ScoreAnswer:
    return ScoreAnswer(
        type="score",
        score=answer.fields["score"],
        confidence=answer.confidence,
        legend={o.key: o.label for o in answer.question.options},
        probabilities=by_key(answer),
    )


def plugin_answer(answer: Answer) -> PluginAnswer:
    return PluginAnswer(type=answer.question.qtype.name, **plugin_fields(answer))


JevAnswer = NoulAnswer | ChoiceAnswer | ScoreAnswer | PluginAnswer

ANSWER_SHAPES: dict[str, Callable[[Answer], JevAnswer]] = {
    "noul": noul_answer,
    "choice": choice_answer,
    "score": score_answer,
}


def response(
    request: SystemOneRequest, ids: list[str], decision: Decision, request_id: str
) -> SystemOneResponse:
    answers: dict[str, JevAnswer] = {}
    failures: dict[str, str] = {}
    for question_id, result in zip(ids, decision.results, strict=True):
        if isinstance(result, Answer):
            answers[question_id] = answer_of(
                result, request.extra.detail, ANSWER_SHAPES, plugin_answer
            )
        else:
            failures[question_id] = result.error.message
    id_, created = response_id("systemone", request_id)
    body = SystemOneResponse(
        id=id_,
        created=created,
        model=decision.served_model,
        answers=answers,
        usage=Usage(input_tokens=decision.input_tokens, output_tokens=len(answers)),
    )
    if failures:
        body.partial_failures = failures
    return body


create_systemone = serving(compiled, response)
