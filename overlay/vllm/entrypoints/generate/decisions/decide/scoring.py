# SPDX-License-Identifier: Apache-2.0
"""The arithmetic every answer shares: readings combined, temperature softmax, confidence."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

CONFIDENCE_FORMULA = "normalized-peak-v1"


def softmax(scores: Sequence[float], temperature: float = 1.0) -> list[float]:
    """``softmax(scores / T)`` for any T > 0; ``-inf`` scores get 0. The top score is subtracted before
    dividing by T: dividing first overflows to ``inf - inf`` = NaN for a T near 0."""
    top = max(scores)
    if top == -math.inf:
        return [1.0 / len(scores)] * len(scores)
    weights = [
        math.exp((s - top) / temperature) if s != -math.inf else 0.0 for s in scores
    ]
    total = math.fsum(weights)
    return [w / total for w in weights]


def log_softmax(scores: Sequence[float]) -> list[float]:
    """A reading as log-probabilities over the options, whatever its scale (``-inf`` stays)."""
    top = max(scores)
    total = top + math.log(sum(math.exp(s - top) for s in scores if s != -math.inf))
    return [s - total for s in scores]


def confidence(probabilities: Sequence[float]) -> float:
    """``(k * max - 1) / (k - 1)``: 1.0 when all mass is on one option, 0.0 when uniform."""
    k = len(probabilities)
    if k < 2:
        return 1.0
    return min(1.0, max(0.0, (k * max(probabilities) - 1.0) / (k - 1)))


def non_finite(values: Any) -> str | None:
    """The path of a NaN or infinity in ``values`` (nested lists and dicts), else None: JSON has no NaN,
    and null is no probability."""
    stack: list[tuple[str, Any]] = [("", values)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            return where or "the value"
    return None


def adjusted(
    rows: Sequence[Sequence[float]],
    positions: Sequence[Sequence[int]],
    priors: Sequence[Sequence[float]] | None,
    bias: Sequence[float] | None,
) -> list[float]:
    """Each option's score, averaged over readings: log-probability, less the content-free prior, plus
    the bias of the option's position in that reading (past the bias's end: none)."""
    count = len(rows[0])
    total = [0.0] * count
    for index, row in enumerate(rows):
        for option in range(count):
            score = row[option]
            if priors is not None:
                score -= priors[index][option]
            if bias is not None and positions[index][option] < len(bias):
                score += bias[positions[index][option]]
            total[option] += score
    return [value / len(rows) for value in total]
