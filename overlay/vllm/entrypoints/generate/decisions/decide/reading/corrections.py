# SPDX-License-Identifier: Apache-2.0
"""Which label layout, prior correction and temperature each question is answered with.

The request's choice wins, else the server's setting; ``auto`` is calibration's choice for the type in
that layout (server's own backend only). ``calibration/in_force.py`` resolves a question against the
record in force; with none, the request and the server decide alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.reading.prior import PriorCache
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import Correction
from vllm.entrypoints.generate.decisions.decide.reading.read import Resolved
from vllm.entrypoints.generate.decisions.decide.settings import (
    AUTO,
    PREFIX,
    Debias,
    PriorSetting,
    uses_fitted,
)
from vllm.entrypoints.generate.decisions.decide.temperature import Temperatures


@dataclass(frozen=True)
class Asked:
    """What a request asked of its reads (None: the server's choice)."""

    debias: Debias
    prior: PriorSetting | None = None
    layout: str | None = None


class Corrections:
    """The server's prior setting and the shared content-free cache."""

    def __init__(
        self, setting: PriorSetting, cache_size: int, cache_bytes: int | None = None
    ) -> None:
        self.setting = setting
        self.cache = PriorCache(cache_size, cache_bytes)

    def mode(self, asked: Asked, chosen: str = "off") -> str:
        """The request's prior mode, else the server's; ``auto``: ``chosen``, calibration's."""
        mode: str = asked.prior or self.setting
        return chosen if mode == AUTO else mode

    def correction(
        self, qtype: str, asked: Asked, mode: str, bias: list[float] | None = None
    ) -> Correction:
        """``mode`` with its fitted position ``bias`` (a fitted mode without one is refused)."""
        if uses_fitted(mode) and bias is None:
            where = "extra.prior" if asked.prior else f"{PREFIX}PRIOR"
            raise DecisionError(
                f"{where}={mode!r}: no position bias was fitted for {qtype} questions in this layout on this "
                f"server (startup calibration off, or too few {qtype} questions in its file); use off or content-free"
            )
        return Correction(mode, self.cache, bias)


@dataclass(frozen=True)
class Calibration:
    """The calibration a request takes at its start; this one fits nothing (T configured, calibration
    not run yet or never), so T and the settings decide alone. ``calibration/in_force.py``'s
    Calibrated adds the record, and its ``stage`` and ``question_reads``."""

    temperatures: Temperatures
    stage: str | None = None
    question_reads: int | None = None

    def resolve(
        self,
        question: CompiledQuestion,
        asked: Asked,
        corrections: Corrections,
        requested_t: float | None = None,
        measured: bool = True,
    ) -> Resolved:
        """``measured``: the request reads with the backend this calibration measured."""
        qtype = question.qtype.name
        applied = self.temperatures.applied(qtype, requested_t)
        correction = corrections.correction(qtype, asked, corrections.mode(asked))
        return Resolved(correction, None, applied)
