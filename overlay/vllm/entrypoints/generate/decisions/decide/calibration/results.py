# SPDX-License-Identifier: Apache-2.0
"""A calibration's saved record, typed: every fit made (server-wide at the top level, each question type
under ``by_type``), the temperatures it gives, and its log lines.

A fresh calibration and a loaded one both go through :class:`CalibrationRecord` and
:meth:`CalibrationRecord.temperatures`, so a restart applies exactly what the first start did, and a
malformed saved file fails validation instead of serving a wrong T.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from vllm.entrypoints.generate.decisions.decide.calibration import question_file
from vllm.entrypoints.generate.decisions.decide.calibration.abstention import Abstention
from vllm.entrypoints.generate.decisions.decide.calibration.bias import TypeReads
from vllm.entrypoints.generate.decisions.decide.calibration.by_type import TypeFit
from vllm.entrypoints.generate.decisions.decide.calibration.examples import (
    QuestionExamples,
)
from vllm.entrypoints.generate.decisions.decide.calibration.maths import (
    CalibrationResult,
)
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    LabelledRead,
    QuestionMap,
)
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.temperature import (
    SERVER,
    Temperature,
    Temperatures,
)

# Part of the saved result's key: a record in another layout (the single-T one before it) is not reused.
SCHEME = "per-type-prior-question-maps-v3"

# A temperature as saved: a positive, finite number (strict: no strings, no booleans).
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
        fit = Fit(
            temperature=result.temperature,
            kept=result.kept,
            ece_raw=result.ece_raw,
            ece_raw_interval=result.ece_raw_interval,
            ece_calibrated=result.ece_calibrated,
            ece_calibrated_interval=result.ece_calibrated_interval,
        )
        return fit.model_dump()


class TypeRecord(Fit):
    """A question type's fit; ``applied_temperature`` is what its answers get (the server-wide T on a
    fallback, named by ``fallback``)."""

    applied_temperature: PositiveT
    used: int
    fallback: str | None

    @classmethod
    def of(cls, fit: TypeFit, server_applied: float) -> TypeRecord:
        own = fit.result is not None and fit.fallback is None
        applied = (
            fit.result.applied_temperature
            if own and fit.result is not None
            else server_applied
        )
        return cls(
            **Fit.fields(fit.result),
            applied_temperature=applied,
            used=fit.used,
            fallback=fit.fallback,
        )

    def log_line(self, name: str) -> str:
        """This type's fit, or why the server-wide T serves it."""
        if self.fallback is not None:
            return (
                f"decision calibration ({name}): {self.fallback}, server-wide T applies"
            )
        verdict = "kept" if self.kept else "not kept, T=1.0"
        return (
            f"decision calibration ({name}): T={self.temperature:.2f} {verdict} (ECE {self.ece_raw:.3f} -> "
            f"{self.ece_calibrated:.3f}, {self.used} questions)"
        )


class QuestionsUsed(BaseModel):
    file: str
    total: int
    used: int
    skipped: list[str]


class CalibrationRecord(Fit):
    """A whole calibration: each type's prior correction, the server-wide fit and one per question type
    (both on the corrected scores), and what it was measured on."""

    applied_temperature: PositiveT
    by_type: dict[str, TypeRecord]
    reads: dict[str, TypeReads]
    questions: QuestionsUsed
    seconds: float
    date: str
    vllm_version: str
    # The labelled question reads answered, over every layout (None in a record saved before it was).
    question_reads: int | None = None
    # Each question's own map, where the operator's labels of it kept one (by bias.question_key).
    question_maps: dict[str, QuestionMap] = Field(default_factory=dict)
    # The confidence threshold for each question type the operator asked a precision of.
    abstention: dict[str, Abstention] = Field(default_factory=dict)
    # The threshold for each question the operator's file asks a precision of (by bias.question_key).
    question_abstention: dict[str, Abstention] = Field(default_factory=dict)
    # Each labelled question's in-context examples as measured, kept or not (by bias.question_key).
    question_examples: dict[str, QuestionExamples] = Field(default_factory=dict)
    # The reads of every question the file labels twice or more (of a type it asks as more than one
    # question), with their labels: a labels file's refit pools its lines of a question with these.
    labelled: list[LabelledRead] = Field(default_factory=list)

    def kept_examples(self) -> dict[str, QuestionExamples]:
        """The questions whose examples the keep rule kept: they are asked with them."""
        return {k: v for k, v in self.question_examples.items() if v.kept}

    @classmethod
    def of(
        cls,
        result: CalibrationResult,
        fits: dict[str, TypeFit],
        reads: dict[str, TypeReads],
        questions: question_file.QuestionFile,
        answered: int,
        skipped: list[str],
        seconds: float,
        question_reads: int | None = None,
        applied: float | None = None,
        question_maps: dict[str, QuestionMap] | None = None,
    ) -> CalibrationRecord:
        """``applied``: the server-wide T answers get, where not ``result``'s own rule's."""
        import vllm

        if applied is None:
            applied = result.applied_temperature
        return cls(
            **Fit.fields(result),
            applied_temperature=applied,
            by_type={name: TypeRecord.of(fit, applied) for name, fit in fits.items()},
            reads=reads,
            questions=QuestionsUsed(
                file=questions.name,
                total=len(questions.questions),
                used=answered,
                skipped=skipped,
            ),
            seconds=round(seconds, 1),
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            vllm_version=vllm.__version__,
            question_reads=question_reads,
            question_maps=question_maps or {},
        )

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
        """Why a temperature this record applies may not (outside VLLM_TYPED_DECISIONS_MIN/MAX_TEMPERATURE:
        a record from another configuration, or edited); None when every one may."""
        applied = {"server-wide": self.applied_temperature}
        applied.update(
            (name, entry.applied_temperature) for name, entry in self.by_type.items()
        )
        for scope, value in applied.items():
            if (problem := settings.temperature_problem(value)) is not None:
                return f"its {scope} T={problem}"
        return None

    def log_line(self, loaded: bool) -> str:
        """The server-wide fit in one line."""
        q = self.questions
        verdict = "kept" if self.kept else "not kept, T=1.0"
        return (
            f"decision calibration: T={self.temperature:.2f} {verdict} (ECE {self.ece_raw:.3f} -> "
            f"{self.ece_calibrated:.3f}, {q.used}/{q.total} questions, {Path(q.file).name}, "
            + ("loaded from a saved result)" if loaded else f"{self.seconds:.0f} s)")
        )
