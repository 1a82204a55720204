# SPDX-License-Identifier: Apache-2.0
"""The arithmetic every answer shares: temperature softmax and the confidence formula."""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE_FORMULA = "normalized-peak-v1"


def softmax(scores: Sequence[float], temperature: float = 1.0) -> list[float]:
    """``softmax(scores / T)``, stable for any finite scores; ``-inf`` scores get probability 0."""
    scaled = [s / temperature for s in scores]
    top = max(scaled)
    if top == -math.inf:
        return [1.0 / len(scaled)] * len(scaled)
    weights = [math.exp(s - top) for s in scaled]
    total = sum(weights)
    return [w / total for w in weights]


def log_softmax(scores: Sequence[float]) -> list[float]:
    """Log-probabilities over the options (``-inf`` stays ``-inf``): a reading as a distribution,
    whatever the scale of its scores."""
    top = max(scores)
    total = top + math.log(sum(math.exp(s - top) for s in scores if s != -math.inf))
    return [s - total for s in scores]


def confidence(probabilities: Sequence[float]) -> float:
    """``(k * max - 1) / (k - 1)``: 1.0 when all mass is on one option, 0.0 when uniform."""
    k = len(probabilities)
    if k < 2:
        return 1.0
    return min(1.0, max(0.0, (k * max(probabilities) - 1.0) / (k - 1)))
