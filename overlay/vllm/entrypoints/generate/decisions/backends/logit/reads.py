# SPDX-License-Identifier: Apache-2.0
"""One engine read of the label tokens, exact or top-k, and what it means for the scores.

exact names the label ids (``logprob_token_ids``): every label is read, bounded by
MAX_LOGPROB_TOKEN_IDS. top-k reads vLLM's plain top-k list (window = ``--max-logprobs``): a label
outside the window scores the window's lowest log-probability, an upper bound on its true value, and
is reported as floored; ``option_mass`` then counts only the labels actually read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from ...errors import DecisionError
from ...host import BackendHost, TokenRead


@dataclass
class LabelRead:
    scores: list[float]
    option_mass: float
    forward_passes: int
    input_tokens: int
    cached_tokens: int
    meta: dict[str, Any] = field(default_factory=dict)


def top_k_window(host: BackendHost) -> int:
    return host.max_logprobs


def scores_from(
    read: TokenRead, labels: Sequence[str], ids: Sequence[int], floor: float
) -> tuple[list[float], list[str]]:
    """Each label's log-probability, or ``floor`` (and its name in the floored list) when unread."""
    scores, floored = [], []
    for label, token in zip(labels, ids, strict=True):
        if token in read.logprobs:
            scores.append(read.logprobs[token])
        else:
            scores.append(floor)
            floored.append(label)
    return scores, floored


def mass(read: TokenRead, ids: Sequence[int]) -> float:
    return sum(math.exp(read.logprobs[t]) for t in set(ids) if t in read.logprobs)


async def read_top_k(host: BackendHost, prompt_ids: list[int], labels: Sequence[str], ids: Sequence[int],
                     request_id: str, fp32: bool = False) -> LabelRead:  # fmt: skip
    window = top_k_window(host)
    read = await host.read_top_logprobs(prompt_ids, window, request_id, fp32)
    scores, floored = scores_from(read, labels, ids, min(read.logprobs.values()))
    meta = {"logprobs": "top-k", "topk_window": window, "floored": floored}
    return LabelRead(scores, mass(read, ids), 1, read.prompt_tokens, read.cached_tokens, meta)


async def read_exact(host: BackendHost, prompt_ids: list[int], labels: Sequence[str], ids: Sequence[int],
                     request_id: str, fallback: bool = True, fp32: bool = False) -> LabelRead:  # fmt: skip
    """An exact read; when the engine returns it incomplete (as under speculative decoding), a
    degraded fallback fills the gaps from a top-k read, or the question fails if ``fallback`` is off.
    ``fp32``: ask for fp32 log-probabilities (:mod:`.precision`)."""
    read = await host.read_token_logprobs(prompt_ids, list(ids), request_id, fp32)
    missing = [label for label, token in zip(labels, ids, strict=True) if token not in read.logprobs]
    if not missing:
        scores, _ = scores_from(read, labels, ids, -math.inf)
        return LabelRead(scores, mass(read, ids), 1, read.prompt_tokens, read.cached_tokens, {"logprobs": "exact"})
    reason = f"the engine's exact read lacked {len(missing)} of {len(ids)} label log-probabilities"
    if not fallback:
        raise DecisionError(f"{reason}; this read has no fallback (try logprobs=top-k)", HTTPStatus.SERVICE_UNAVAILABLE)
    top = await host.read_top_logprobs(prompt_ids, top_k_window(host), f"{request_id}-fallback", fp32)
    merged = TokenRead({**top.logprobs, **read.logprobs}, read.prompt_tokens, read.cached_tokens + top.cached_tokens)
    scores, floored = scores_from(merged, labels, ids, min(top.logprobs.values()))
    meta = {"logprobs": "exact", "degraded": True, "degraded_reason": reason, "floored": floored,
            "topk_window": top_k_window(host)}  # fmt: skip
    return LabelRead(scores, mass(merged, ids), 2, read.prompt_tokens + top.prompt_tokens, merged.cached_tokens, meta)
