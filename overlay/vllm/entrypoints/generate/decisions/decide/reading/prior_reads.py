# SPDX-License-Identifier: Apache-2.0
"""The prior correction as a step of a read: content-free reads, and the correction applied."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.calls import (
    backend_read,
    checked_scores,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    NEUTRAL_INPUTS,
    PriorCache,
    PriorRead,
    fingerprint,
    mean_log_probabilities,
)
from vllm.entrypoints.generate.decisions.decide.reports import PriorAudit
from vllm.entrypoints.generate.decisions.decide.scoring import adjusted
from vllm.entrypoints.generate.decisions.decide.settings import uses_fitted


@dataclass(frozen=True)
class Correction:
    """The prior correction a read asks for; ``bias``: the fitted one per position, if any."""

    mode: str = "off"
    cache: PriorCache | None = None
    bias: list[float] | None = None


NO_CORRECTION = Correction()


async def prior_read(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    correction: Correction,
) -> PriorRead:
    """``question``'s content-free log-probabilities in the order given, cached or read now."""
    assert correction.cache is not None
    key = fingerprint(
        backend.name,
        backend.render_version,
        context.options,
        question.qtype.name,
        question.instructions,
        [o.text for o in question.options],
        [(example.state, example.answer) for example in context.examples],
    )

    async def neutral() -> list[float]:
        readings = await gather_or_cancel(
            backend_read(
                backend, question, context.with_state(text, f"{context.request_id}-{i}")
            )
            for i, text in enumerate(NEUTRAL_INPUTS)
        )
        return mean_log_probabilities(
            [checked_scores(r, len(question.options), backend.name) for r in readings]
        )

    return await correction.cache.get(key, neutral)


def corrected(
    question: CompiledQuestion,
    rows: list[list[float]],
    positions: list[list[int]],
    priors: list[list[float]] | None,
    correction: Correction,
    cached: bool | None,
) -> tuple[list[float], PriorAudit]:
    """The scores ``correction`` (not off) makes of a read's rows (as in QuestionRead), and its audit."""
    fitted = correction.bias if uses_fitted(correction.mode) else None
    scores = adjusted(rows, positions, priors, fitted)
    keys = [o.key for o in question.options]
    bias = None
    if fitted is not None:
        zero = [[0.0] * len(keys) for _ in rows]
        bias = dict(zip(keys, adjusted(zero, positions, None, fitted), strict=True))
    content_free = None
    if priors is not None:
        content_free = {
            k: sum(p[i] for p in priors) / len(priors) for i, k in enumerate(keys)
        }
    return scores, PriorAudit(
        mode=correction.mode,
        content_free=content_free,
        cached=cached,
        bias=bias,
        adjusted_logits=dict(zip(keys, scores, strict=True)),
    )
