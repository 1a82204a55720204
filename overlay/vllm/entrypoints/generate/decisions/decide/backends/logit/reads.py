# SPDX-License-Identifier: Apache-2.0
"""One engine read of the label tokens: exact (``logprob_token_ids``) or top-k (``--max-logprobs``).

In a top-k read a label outside the window scores the window's lowest log-probability, an upper bound
on its true value, and is reported as floored; ``option_mass`` counts only the labels read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

from pydantic import BaseModel

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.host import BackendHost, TokenRead
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext


class ReadFacts(BaseModel):
    """How the labels were read, in each answer's ``extra.backend``: the fields a read sets."""

    logprobs: Literal["top-k", "exact"]
    # top-k reads, and exact reads completed from one: the window, and the labels it floored.
    topk_window: int | None = None
    floored: list[str] | None = None
    # An exact read the engine returned incomplete, completed from a top-k read.
    degraded: bool | None = None
    degraded_reason: str | None = None
    # Two-stage reads: each option's stage-1 log-probability (null for zero), and the finalists.
    stage1_scores: dict[str, float | None] | None = None
    shortlist: list[str] | None = None


class ReadAudit(BaseModel):
    """What the logit backend adds to each answer's ``extra.audit``."""

    label_layout: str
    logit_precision: str


@dataclass
class LabelRead:
    scores: list[float]
    option_mass: float
    forward_passes: int
    input_tokens: int
    cached_tokens: int
    facts: ReadFacts = field(default_factory=lambda: ReadFacts(logprobs="exact"))


def scores_from(
    read: TokenRead, labels: Sequence[str], ids: Sequence[int], floor: float
) -> tuple[list[float], list[str]]:
    """Each label's log-probability, or ``floor`` (and its name in the floored list) where unread."""
    got = read.logprobs
    floored = [label for label, t in zip(labels, ids, strict=True) if t not in got]
    return [got.get(t, floor) for t in ids], floored


def mass(read: TokenRead, ids: Sequence[int]) -> float:
    return sum(math.exp(read.logprobs[t]) for t in set(ids) if t in read.logprobs)


async def read_top_k(
    host: BackendHost,
    prompt_ids: list[int],
    labels: Sequence[str],
    ids: Sequence[int],
    context: ReadContext[Any],
    fp32: bool = False,
) -> LabelRead:
    window = host.max_logprobs
    read = await host.read_top_logprobs(prompt_ids, window, context, fp32)
    scores, floored = scores_from(read, labels, ids, min(read.logprobs.values()))
    facts = ReadFacts(logprobs="top-k", topk_window=window, floored=floored)
    return LabelRead(
        scores, mass(read, ids), 1, read.prompt_tokens, read.cached_tokens, facts
    )


async def read_exact(
    host: BackendHost,
    prompt_ids: list[int],
    labels: Sequence[str],
    ids: Sequence[int],
    context: ReadContext[Any],
    fallback: bool = True,
    fp32: bool = False,
) -> LabelRead:
    """An exact read; one the engine returns incomplete (as under speculative decoding) is filled in
    from a top-k read, or fails if ``fallback`` is off."""
    read = await host.read_token_logprobs(prompt_ids, list(ids), context, fp32)
    scores, missing = scores_from(read, labels, ids, -math.inf)
    if not missing:
        return LabelRead(
            scores, mass(read, ids), 1, read.prompt_tokens, read.cached_tokens
        )
    reason = f"the engine's exact read lacked {len(missing)} of {len(ids)} label log-probabilities"
    if not fallback:
        raise DecisionError(
            f"{reason}; this read has no fallback (try logprobs=top-k)",
            HTTPStatus.SERVICE_UNAVAILABLE,
        )
    window = host.max_logprobs
    top = await host.read_top_logprobs(
        prompt_ids, window, context.part("fallback"), fp32
    )
    merged = TokenRead(
        {**top.logprobs, **read.logprobs},
        read.prompt_tokens,
        read.cached_tokens + top.cached_tokens,
    )
    scores, floored = scores_from(merged, labels, ids, min(top.logprobs.values()))
    facts = ReadFacts(
        logprobs="exact",
        degraded=True,
        degraded_reason=reason,
        floored=floored,
        topk_window=window,
    )
    return LabelRead(
        scores,
        mass(merged, ids),
        2,
        read.prompt_tokens + top.prompt_tokens,
        merged.cached_tokens,
        facts,
    )
