"""Decision requests for service tests, built as the wires build them."""

from __future__ import annotations

from typing import Any

from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.request import DecisionRequest
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
