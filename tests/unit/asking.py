"""Decision requests for service tests, built as the wires build them, and one question read as
the service reads it."""

from __future__ import annotations

from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import (
    QuestionRead,
    Resolved,
    plan_read,
    read,
)
from vllm.entrypoints.generate.decisions.decide.serving.request import DecisionRequest
from vllm.entrypoints.generate.decisions.decide.settings import Debias, parse_debias


def ask(
    state: str,
    questions: list[CompiledQuestion],
    request_id: str = "r",
    debias: Debias | str | None = None,
    **extra: Any,
) -> DecisionRequest:
    """A request about ``state`` naming its questions as the OpenAI wire does (``questions[0]``...)."""
    if isinstance(debias, str):
        debias = parse_debias(debias)
    names = tuple(f"questions[{i}]" for i in range(len(questions)))
    return DecisionRequest(
        state, tuple(questions), names, request_id, debias=debias, **extra
    )


async def read_question(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    debias: Debias,
    correction: Correction = NO_CORRECTION,
) -> QuestionRead:
    """``question`` read as the service reads it: planned, then the plan run."""
    return await read(
        plan_read(backend, question, context, debias, Resolved(correction))
    )
