# SPDX-License-Identifier: Apache-2.0
"""Serving ``POST /v1/decisions``: a :class:`DecisionsRequest` compiled for the decision service, and
its decision as a :class:`DecisionsResponse`. A predicate is read as a ``noul`` without criteria, a
choice as a ``choice``, a score as a ``score``, so each renders exactly as the same Jev question."""

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
    CHOICE,
    NOUL,
    SCORE,
    CompiledQuestion,
    NoulQuestion,
    choice_options,
    level_options,
    within,
)
from vllm.entrypoints.generate.decisions.decide.serving.request import DecisionRequest
from vllm.entrypoints.generate.decisions.decide.serving.service import (
    check_option_count,
    check_question_count,
)
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.validation import validation_message
from vllm.entrypoints.generate.decisions.http.wire.common import (
    answer_of,
    decision_request,
    option_probabilities,
    plugin_fields,
    response_id,
    serving,
)
from vllm.entrypoints.generate.decisions.http.wire.openai.input import (
    parse_items,
    parts_text,
    render_input,
)
from vllm.entrypoints.generate.decisions.http.wire.openai.protocol import (
    BUILT_IN,
    ChoiceAnswer,
    ChoiceProbability,
    ChoiceQuestion,
    DecisionsRequest,
    DecisionsResponse,
    InputTokensDetails,
    LevelProbability,
    OutputTokensDetails,
    PluginAnswer,
    PredicateAnswer,
    PredicateQuestion,
    Refusal,
    RefusalExtra,
    ResponseExtra,
    ScoreAnswer,
    ScoreQuestion,
    Usage,
)

AnyAnswer = PredicateAnswer | ChoiceAnswer | ScoreAnswer | PluginAnswer

# The field listing each built-in question's options, and the type its options are limited as.
OPTIONS_FIELD = {"choice": "choices", "score": "levels"}
BUILT_IN_TYPES = {"predicate": NOUL, "choice": CHOICE, "score": SCORE}


def input_text(value: str | list[Any], budget: RenderBudget) -> str:
    return value if isinstance(value, str) else render_input(parse_items(value), budget)


def compile_question(
    index: int, raw: Any, settings: Settings, budget: RenderBudget
) -> tuple[str | None, CompiledQuestion]:
    """(name, compiled question); a type other than OpenAI's three is a plugin's (Jev's are not)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in BUILT_IN:
        return compile_plugin_question(index, raw, budget)
    if isinstance(options := raw.get(OPTIONS_FIELD.get(kind, "")), list):
        check_option_count(
            settings, BUILT_IN_TYPES[kind], len(options), f"questions[{index}]"
        )
    try:
        question = BUILT_IN[kind].model_validate(raw)
    except ValidationError as exc:
        raise DecisionError(validation_message(exc, f"questions[{index}]")) from None
    text = parts_text(question.instructions, f"questions[{index}].instructions", budget)
    if isinstance(question, PredicateQuestion):
        return question.name, NOUL.compile(NoulQuestion(instructions=text), budget)
    if isinstance(question, ChoiceQuestion):
        options = choice_options([(c.value, c.description) for c in question.choices])
    else:
        assert isinstance(question, ScoreQuestion)
        options = level_options([(lv.label, lv.description) for lv in question.levels])
    asked = CompiledQuestion(BUILT_IN_TYPES[kind], text, options)
    return question.name, within(asked, budget.max_value_chars)


def compile_plugin_question(
    index: int, raw: Any, budget: RenderBudget
) -> tuple[str | None, CompiledQuestion]:
    if not isinstance(raw, dict):
        raise DecisionError(f"questions[{index}]: must be an object")
    kind = raw.get("type")
    qtype = question_type(kind) if isinstance(kind, str) else None
    if qtype is None or built_in_question_type(qtype):
        raise DecisionError(
            f"questions[{index}].type: unknown question type {shown(kind)}"
            + failures_note()
        )
    name = raw.get("name")
    if "name" in raw and not isinstance(name, str):
        raise DecisionError(f"questions[{index}].name: must be a string when given")
    try:
        question = qtype.model.model_validate(
            {k: v for k, v in raw.items() if k != "name"}
        )
    except ValidationError as exc:
        raise DecisionError(validation_message(exc, f"questions[{index}]")) from None
    return name, qtype.compile(question, budget)


def compiled(
    request: DecisionsRequest, request_id: str, settings: Settings
) -> tuple[list[str | None], DecisionRequest]:
    check_question_count(settings, len(request.questions))
    budget = RenderBudget.of(settings)
    state = input_text(request.input, budget)
    named = [
        compile_question(i, q, settings, budget)
        for i, q in enumerate(request.questions)
    ]
    where = [f"questions[{i}]" for i in range(len(named))]
    return [n for n, _ in named], decision_request(
        request.extra, state, [q for _, q in named], where, request_id, request.model
    )


def predicate_answer(name: str | None, answer: Answer) -> PredicateAnswer:
    return PredicateAnswer(
        name=name, type="predicate", probability=answer.fields["probability"]
    )


def choice_answer(name: str | None, answer: Answer) -> ChoiceAnswer:
    return ChoiceAnswer(
        name=name,
        type="choice",
        choice=answer.fields["choice"],
        probabilities=[
            ChoiceProbability(value=o.value, probability=p)
            for o, p in option_probabilities(answer)
        ],
        confidence=answer.confidence,
    )


def score_answer(name: str | None, answer: Answer) -> ScoreAnswer:
    return ScoreAnswer(
        name=name,
        type="score",
        score=answer.fields["score"],
        probabilities=[
            LevelProbability(label=o.label, value=o.value, probability=p)
            for o, p in option_probabilities(answer)
        ],
        confidence=answer.confidence,
    )


def plugin_answer(name: str | None, answer: Answer) -> PluginAnswer:
    qtype = answer.question.qtype.name
    return PluginAnswer(name=name, type=qtype, **plugin_fields(answer))


# by the compiled type (a predicate is a noul)
ANSWER_SHAPES: dict[str, Callable[[str | None, Answer], AnyAnswer]] = {
    "noul": predicate_answer,
    "choice": choice_answer,
    "score": score_answer,
}


def response(
    request: DecisionsRequest,
    names: list[str | None],
    decision: Decision,
    request_id: str,
) -> DecisionsResponse:
    answers: list[AnyAnswer | Refusal] = [
        answer_of(result, request.extra.detail, ANSWER_SHAPES, plugin_answer, name)
        if isinstance(result, Answer)
        else Refusal(
            type="refusal", name=name, extra=RefusalExtra(error=result.error.message)
        )
        for name, result in zip(names, decision.results, strict=True)
    ]
    id_, created = response_id("decisions", request_id)
    return DecisionsResponse(
        model=decision.served_model,
        answers=answers,
        usage=Usage(
            input_tokens=decision.input_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=decision.cached_tokens, cache_write_tokens=0
            ),
            output_tokens=0,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            total_tokens=decision.input_tokens,
        ),
        extra=ResponseExtra(id=id_, created=created),
    )


create_decision = serving(compiled, response)
