# SPDX-License-Identifier: Apache-2.0
"""A calibration's record, typed: a restart applies exactly what the first start did, and a malformed
saved file fails validation instead of serving a wrong T."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from vllm.entrypoints.generate.decisions.calibration.in_force import (
    Abstention,
    LabelledRead,
    QuestionExamples,
    QuestionMap,
    TypeReads,
)
from vllm.entrypoints.generate.decisions.calibration.maths import CalibrationResult
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.temperature import (
    SERVER,
    Temperature,
    Temperatures,
)

# Part of the saved result's key: a record in another layout is not reused.
SCHEME = "per-type-prior-question-maps-v3"

# Strict: no strings, no booleans.
PositiveT = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


class Fit(BaseModel):
    """One fit's numbers; all None when no fit was made."""

    temperature: float | None = None
    kept: bool | None = None
    ece_raw: float | None = None
    ece_raw_interval: tuple[float, float] | None = None
    ece_calibrated: float | None = None
    ece_calibrated_interval: tuple[float, float] | None = None

    @staticmethod
    def fields(result: CalibrationResult | None) -> dict[str, Any]:
        if result is None:
            return {}
        return Fit(**{n: getattr(result, n) for n in Fit.model_fields}).model_dump()

    def summary(self) -> str:
        verdict = "kept" if self.kept else "not kept, T=1.0"
        ece = f"(ECE {self.ece_raw:.3f} -> {self.ece_calibrated:.3f}"
        return f"T={self.temperature:.2f} {verdict} {ece}"


class TypeRecord(Fit):
    """A question type's fit; ``applied_temperature``: the server-wide T on a ``fallback``."""

    applied_temperature: PositiveT
    used: int
    fallback: str | None

    def log_line(self, name: str) -> str:
        how = (
            f"{self.fallback}, server-wide T applies"
            if self.fallback is not None
            else f"{self.summary()}, {self.used} questions)"
        )
        return f"decision calibration ({name}): {how}"


class CalibrationFailure(BaseModel):
    """A calibration that found no fit; a ``lasting`` one spares later runs too."""

    failed: str
    run: str
    lasting: bool = False


class QuestionsUsed(BaseModel):
    file: str
    total: int
    used: int
    skipped: list[str]


class CalibrationRecord(Fit):
    """A whole calibration: each type's reads, the server-wide fit and one per type."""

    applied_temperature: PositiveT
    by_type: dict[str, TypeRecord]
    reads: dict[str, TypeReads]
    questions: QuestionsUsed
    seconds: float
    date: str
    vllm_version: str
    # The labelled question reads answered, over every layout (None in older records).
    question_reads: int | None = None
    # By question_key below; question_examples as measured, kept or not.
    question_maps: dict[str, QuestionMap] = Field(default_factory=dict)
    abstention: dict[str, Abstention] = Field(default_factory=dict)  # by type
    question_abstention: dict[str, Abstention] = Field(default_factory=dict)
    question_examples: dict[str, QuestionExamples] = Field(default_factory=dict)
    # Reads of each question labelled twice or more, which a labels file's refit pools with.
    labelled: list[LabelledRead] = Field(default_factory=list)

    def temperatures(self) -> Temperatures:
        """The temperatures this record gives: server-wide, and each type that kept its own fit."""
        by_type = {
            name: Temperature(entry.applied_temperature, "calibrated", name)
            for name, entry in self.by_type.items()
            if entry.fallback is None
        }
        return Temperatures(
            Temperature(self.applied_temperature, "calibrated", SERVER), by_type
        )

    def temperature_problem(self, settings: Settings) -> str | None:
        """Why a temperature this record applies is outside the settings' range, if one is."""
        applied = {"server-wide": self.applied_temperature} | {
            name: entry.applied_temperature for name, entry in self.by_type.items()
        }
        for scope, value in applied.items():
            if (problem := settings.temperature_problem(value)) is not None:
                return f"its {scope} T={problem}"
        return None

    def log_line(self, loaded: bool) -> str:
        q = self.questions
        return (
            f"decision calibration: {self.summary()}, {q.used}/{q.total} questions, "
            f"{Path(q.file).name}, "
            + ("loaded from a saved result)" if loaded else f"{self.seconds:.0f} s)")
        )


Outcome = CalibrationRecord | CalibrationFailure


def saved_outcome(saved: dict[str, Any]) -> Outcome:
    """A saved result as a failure or the fits (ValidationError when malformed)."""
    if "failed" in saved:
        return CalibrationFailure.model_validate(saved)
    return CalibrationRecord.model_validate(saved)
