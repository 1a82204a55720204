# SPDX-License-Identifier: Apache-2.0
"""Noise draws and what several reads of one question say together."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def noise_tokens(seed: int, count: int, vocab_size: int) -> list[int]:
    """``count`` noise tokens, uniform over the vocabulary (as the engine draws a fresh canvas), fixed by
    ``seed`` alone, so the same seed gives the same canvases on any host."""
    draw = random.Random(seed)
    return [draw.randrange(vocab_size) for _ in range(count)]


@dataclass(frozen=True)
class Average:
    probabilities: list[float]
    # The standard error of each option's mean probability (0 for one sample).
    stderr: list[float]
    # The share of samples whose top option is the average's top option.
    agreement: float


def average(distributions: Sequence[Sequence[float]]) -> Average:
    n = len(distributions)
    means = [sum(column) / n for column in zip(*distributions, strict=True)]
    if n > 1:
        stderr = [
            math.sqrt(sum((p - mean) ** 2 for p in column) / (n - 1) / n)
            for column, mean in zip(
                zip(*distributions, strict=True), means, strict=True
            )
        ]
    else:
        stderr = [0.0] * len(means)
    top = _top(means)
    return Average(means, stderr, sum(_top(d) == top for d in distributions) / n)


def _top(probabilities: Sequence[float]) -> int:
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
