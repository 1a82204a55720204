# SPDX-License-Identifier: Apache-2.0
"""The prior correction as a step of a read (the corrections themselves: prior.py): the
content-free reads of a question, from the cache or read with the real ones, and the correction
applied to a read's rows, with its audit."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    uses_fitted,
)
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
from vllm.entrypoints.generate.decisions.decide.reading.rotation import (
    in_client_order,
    reordered,
)
from vllm.entrypoints.generate.decisions.decide.reports import PriorAudit
from vllm.entrypoints.generate.decisions.decide.scoring import (
    adjusted,
)


@dataclass(frozen=True)
class Correction:
    """The prior correction a read asks for (prior.py): the mode, the cache of content-free reads
    (needed by the content-free modes) and the fitted bias per position (None: none fitted)."""

    mode: str = "off"
    cache: PriorCache | None = None
    bias: list[float] | None = None


NO_CORRECTION = Correction()


def prior_reads(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    orders: list[list[int]],
    correction: Correction,
) -> list[Awaitable[PriorRead]]:
    """The content-free reads of ``question`` in each of ``orders``."""
    return [
        prior_read(
            backend, reordered(question, order), context.part(f"p{i}"), correction
        )
        for i, order in enumerate(orders)
    ]


async def prior_read(
    backend: DecisionBackend,
    question: CompiledQuestion,
    context: ReadContext[Any],
    correction: Correction,
) -> PriorRead:
    """``question``'s content-free log-probabilities in the order given, from the cache or read now (about
    each neutral input in place of ``context``'s state)."""
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
        reads = [
            backend_read(
                backend, question, context.with_state(text, f"{context.request_id}-{i}")
            )
            for i, text in enumerate(NEUTRAL_INPUTS)
        ]
        readings = await gather_or_cancel(reads)
        return mean_log_probabilities(
            [checked_scores(r, len(question.options), backend.name) for r in readings]
        )

    return await correction.cache.get(key, neutral)


def in_client_priors(
    priors: list[PriorRead], orders: list[list[int]]
) -> list[list[float]]:
    """Each order's content-free log-probabilities at the options' positions as sent."""
    return [
        in_client_order(p.logprobs, order)
        for p, order in zip(priors, orders, strict=True)
    ]


def corrected(
    question: CompiledQuestion,
    rows: list[list[float]],
    positions: list[list[int]],
    priors: list[list[float]] | None,
    correction: Correction,
    cached: bool | None,
) -> tuple[list[float], PriorAudit]:
    """The scores ``correction`` (not off) makes of a read's ``rows`` (each order's
    log-probabilities, client order; ``positions`` each option's place in that order; ``priors``
    the content-free reads where the mode takes them), and its audit."""
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
    audit = PriorAudit(
        mode=correction.mode,
        content_free=content_free,
        cached=cached,
        bias=bias,
        adjusted_logits=dict(zip(keys, scores, strict=True)),
    )
    return scores, audit
