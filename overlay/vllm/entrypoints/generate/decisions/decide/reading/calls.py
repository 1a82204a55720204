# SPDX-License-Identifier: Apache-2.0
"""The one way the package calls a backend's ``read``, and the check of what it returns."""

from __future__ import annotations

import math
from http import HTTPStatus
from typing import Any, cast

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext


async def backend_read(
    backend: DecisionBackend[Any], question: CompiledQuestion, context: ReadContext[Any]
) -> Reading:
    """Also calls backends written for the old ``read`` signature."""
    if backend.legacy_read:
        legacy: Any = backend.read
        return cast(
            Reading,
            await legacy(context.state, question, context.request_id, context.options),
        )
    return await backend.read(question, context)


def checked_scores(reading: Any, options: int, backend: str) -> list[float]:
    """A backend's scores as floats, one per option, finite or -inf, not all -inf; anything else is
    the backend's fault, refused (500) rather than sent on as NaN."""
    scores = getattr(reading, "scores", None)
    try:
        values = [float(score) for score in scores]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        values = None
    if values is None or len(values) != options:
        count = len(values) if values is not None else repr(scores)[:40]
        fault = f"returned {count} scores for {options} options"
    elif any(math.isnan(v) or v == math.inf for v in values):
        fault = "returned a score that is NaN or +inf"
    elif all(v == -math.inf for v in values):
        fault = "gave every option zero probability"
    else:
        return values
    raise DecisionError(
        f"backend {backend!r} {fault}", HTTPStatus.INTERNAL_SERVER_ERROR
    )
