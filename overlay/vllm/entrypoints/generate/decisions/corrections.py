# SPDX-License-Identifier: Apache-2.0
"""Which prior correction (prior.py) and which temperature each question is answered with.

The request's ``extra.prior`` wins, else the server's VLLM_TYPED_DECISIONS_PRIOR; ``auto`` is what
startup calibration chose for the question's type (``off`` where it chose nothing). The temperature
follows the scores it divides: the type's calibrated T for the correction calibration chose, that
correction's own fitted T (scope ``type:mode``) for another one, the server-wide T where the type has
no fits. A request's or a configured T overrides both, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .calibration.bias import ReadChoice
from .calibration.temperature import Temperature, Temperatures
from .debias import Correction
from .errors import DecisionError
from .prior import AUTO, PriorCache, uses_fitted
from .settings import PREFIX


@dataclass(frozen=True)
class Calibrated:
    """What startup calibration gives the server: its temperatures and each type's read choice."""

    temperatures: Temperatures
    reads: Mapping[str, ReadChoice] = field(default_factory=dict)


class Corrections:
    """The server's prior setting, calibration's choices, and the content-free reads shared by every
    request (cached per question fingerprint)."""

    def __init__(self, setting: str, cache_size: int) -> None:
        self.setting = setting
        self.cache = PriorCache(cache_size)
        self.reads: Mapping[str, ReadChoice] = {}

    def mode_for(self, qtype: str, requested: str | None = None) -> str:
        mode = requested or self.setting
        if mode != AUTO:
            return mode
        choice = self.reads.get(qtype)
        return choice.mode if choice is not None else "off"

    def resolve(self, qtype: str, requested: str | None, temperatures: Temperatures,
                requested_t: float | None) -> tuple[Correction, Temperature]:  # fmt: skip
        """The correction for a question of type ``qtype`` and the T its corrected scores get."""
        mode = self.mode_for(qtype, requested)
        choice = self.reads.get(qtype)
        candidate = choice.candidates.get(mode) if choice is not None else None
        bias = candidate.bias if candidate is not None else None
        if uses_fitted(mode) and bias is None:
            where = "extra.prior" if requested else f"{PREFIX}PRIOR"
            raise DecisionError(
                f"{where}={mode!r}: no position bias was fitted for {qtype} questions on this server "
                f"(startup calibration off, or too few {qtype} questions in its file); use off or content-free"
            )
        applied = temperatures.applied(qtype, requested_t)
        if applied.source == "calibrated" and choice is not None and candidate is not None and mode != choice.mode:
            applied = Temperature(candidate.temperature, "calibrated", f"{qtype}:{mode}")
        return Correction(mode, self.cache, bias), applied
