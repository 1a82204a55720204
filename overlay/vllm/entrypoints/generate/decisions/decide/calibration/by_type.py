# SPDX-License-Identifier: Apache-2.0
"""Calibration per question type: a model can be overconfident on choices and already calibrated on
yes/no, and one T for both over-corrects one of them. Each type with enough answered questions gets its
own fit under the server-wide keep rule (maths.calibrate); any other type falls back to the server-wide T.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.calibration.maths import (
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    CalibrationResult,
    calibrate,
)


@dataclass(frozen=True)
class TypeFit:
    used: int  # answered questions of this type
    # None when no fit was made (too few questions, the maths refused)
    result: CalibrationResult | None
    # why the server-wide T applies instead; None when this type's own fit does
    fallback: str | None


def fit_types(
    names: Iterable[str],
    types: Sequence[str],
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    minimum: int,
) -> dict[str, TypeFit]:
    """A fit for each type in ``names`` over its own answered questions (``types[i]`` is question i's type).

    A type with fewer than ``minimum`` answered questions, one the maths refuses (say, all in one group)
    and one whose T lands at the range's edge fall back; unlike the server-wide fit, an edge fit here is
    not a failure, since the server-wide T still serves that type.
    """
    fits: dict[str, TypeFit] = {}
    for name in names:
        rows = [i for i, kind in enumerate(types) if kind == name]
        if len(rows) < minimum:
            fits[name] = TypeFit(
                len(rows), None, f"too few questions ({len(rows)} < {minimum})"
            )
            continue
        try:
            result = calibrate(
                [scores[i] for i in rows],
                [correct[i] for i in rows],
                [groups[i] for i in rows],
            )
        except ValueError as exc:
            fits[name] = TypeFit(len(rows), None, str(exc))
            continue
        edge = (
            f"the fitted T={result.temperature:.3f} is at the edge of [{LOW_TEMPERATURE}, {HIGH_TEMPERATURE:g}]"
            if result.at_edge
            else None
        )
        fits[name] = TypeFit(len(rows), result, edge)
    return fits
