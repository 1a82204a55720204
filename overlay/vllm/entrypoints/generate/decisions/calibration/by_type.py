# SPDX-License-Identifier: Apache-2.0
"""A temperature per question type: a model can be overconfident on choices and calibrated on yes/no,
and one T for both over-corrects one of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.calibration.maths import (
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    CalibrationResult,
    Labelled,
    calibrate,
)


@dataclass(frozen=True)
class TypeFit:
    used: int  # answered questions of this type
    result: CalibrationResult | None  # None: no fit made
    fallback: str | None  # why the server-wide T applies instead


def fit_types(
    names: Iterable[str],
    types: Sequence[str],
    labelled: Labelled,
    minimum: int,
) -> dict[str, TypeFit]:
    """A fit for each type; an edge T falls back to the server-wide T, here no failure."""
    fits: dict[str, TypeFit] = {}
    for name in names:
        rows = [i for i, kind in enumerate(types) if kind == name]
        used = len(rows)
        if used < minimum:
            fits[name] = TypeFit(used, None, f"too few questions ({used} < {minimum})")
            continue
        try:
            result = calibrate(labelled.rows(rows))
        except ValueError as exc:
            fits[name] = TypeFit(used, None, str(exc))
            continue
        edge = (
            f"the fitted T={result.temperature:.3f} is at the edge of [{LOW_TEMPERATURE}, {HIGH_TEMPERATURE:g}]"
            if result.at_edge
            else None
        )
        fits[name] = TypeFit(used, result, edge)
    return fits
