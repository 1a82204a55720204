# SPDX-License-Identifier: Apache-2.0
"""In-context examples: they may help a small model or pull every answer toward their labels, so they
are measured as maps are, a map fitted on reads with them against one on reads without (so the gain is
the examples', not a map's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vllm.entrypoints.generate.decisions.calibration.abstention import (
    held_out_threshold,
)
from vllm.entrypoints.generate.decisions.calibration.maths import Labelled
from vllm.entrypoints.generate.decisions.calibration.question_map import (
    compared,
    fit_map,
    held_out,
)
from vllm.entrypoints.generate.decisions.decide.reading.calibrated import (
    QuestionExamples,
    ShownExample,
)

# An input longer than this is not shown as an example: examples sit in every prompt of their
# question, and a long one would crowd out the input itself.
MAX_EXAMPLE_CHARS = 1500


def pick_examples(
    states: Sequence[str], answers: Sequence[str], count: int
) -> list[int]:
    """Which labelled inputs to show: the answers in turn, none twice before every one once."""
    queues: dict[str, list[int]] = {}
    for index, (state, answer) in enumerate(zip(states, answers, strict=True)):
        if len(state) <= MAX_EXAMPLE_CHARS:
            queues.setdefault(answer, []).append(index)
    picked: list[int] = []
    while len(picked) < count and any(queues.values()):
        for queue in queues.values():
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def measure_examples(
    examples: Sequence[ShownExample],
    plain: Labelled,
    shown: Sequence[Sequence[float]],
    scale: float,
    precision: float | None = None,
) -> QuestionExamples:
    """``examples`` measured: ``shown``, ``plain``'s labels read with examples from the other folds."""
    read_with = dataclasses.replace(plain, scores=shown)
    base, _ = held_out(plain, scale)
    with_examples, _ = held_out(read_with, scale)
    fitted_scale, fitted_bias = fit_map(shown, plain.correct, scale)
    return QuestionExamples(
        examples=list(examples),
        scale=fitted_scale,
        bias=fitted_bias,
        abstention=(
            held_out_threshold(with_examples, read_with, precision)
            if precision is not None
            else None
        ),
        **compared(with_examples, base, plain).model_dump(),
    )
