# SPDX-License-Identifier: Apache-2.0
"""A calibration's saved record: every fit made (server-wide at the top level, each question type under
``by_type``), the temperatures it gives, and its log lines.

A fresh calibration and a loaded one both turn their record into temperatures with :func:`restore`, so
a restart applies exactly what the first start did.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from . import question_file
from .by_type import TypeFit
from .maths import CalibrationResult
from .temperature import SERVER, Temperature, Temperatures

# Part of the saved result's key: a record in another layout (the single-T one before it) is not reused.
SCHEME = "per-type-v1"


def fit_fields(result: CalibrationResult | None) -> dict[str, Any]:
    """One fit's numbers; all None when no fit was made."""
    if result is None:
        return dict.fromkeys(("temperature", "kept", "ece_raw", "ece_raw_interval", "ece_calibrated",
                              "ece_calibrated_interval"))  # fmt: skip
    return {
        "temperature": result.temperature,
        "kept": result.kept,
        "ece_raw": result.ece_raw,
        "ece_raw_interval": list(result.ece_raw_interval),
        "ece_calibrated": result.ece_calibrated,
        "ece_calibrated_interval": list(result.ece_calibrated_interval),
    }


def type_entry(fit: TypeFit, server_applied: float) -> dict[str, Any]:
    """A type's fit; ``applied_temperature`` is what its answers get (the server-wide T on a fallback)."""
    applied = fit.result.applied_temperature if fit.result is not None and fit.fallback is None else server_applied
    return {**fit_fields(fit.result), "applied_temperature": applied, "used": fit.used, "fallback": fit.fallback}


def summary(result: CalibrationResult, fits: dict[str, TypeFit], questions: question_file.QuestionFile,
            answered: int, skipped: list[str], seconds: float) -> dict[str, Any]:  # fmt: skip
    import vllm

    return {
        **fit_fields(result),
        "applied_temperature": result.applied_temperature,
        "by_type": {name: type_entry(fit, result.applied_temperature) for name, fit in fits.items()},
        "questions": {"file": questions.name, "total": len(questions.questions), "used": answered, "skipped": skipped},
        "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vllm_version": vllm.__version__,
    }


def _temperature(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"not a temperature: {value!r}")
    return float(value)


def restore(record: dict[str, Any]) -> Temperatures:
    """The temperatures a record gives; raises (KeyError, TypeError, ValueError, AttributeError) on a
    malformed one."""
    by_type = {
        name: Temperature(_temperature(entry["applied_temperature"]), "calibrated", name)
        for name, entry in record["by_type"].items()
        if entry["fallback"] is None
    }
    return Temperatures(Temperature(_temperature(record["applied_temperature"]), "calibrated", SERVER), by_type)


def log_line(record: dict[str, Any], loaded: bool) -> str:
    """The server-wide fit in one line."""
    q = record["questions"]
    verdict = "kept" if record["kept"] else "not kept, T=1.0"
    return (
        f"decision calibration: T={record['temperature']:.2f} {verdict} (ECE {record['ece_raw']:.3f} -> "
        f"{record['ece_calibrated']:.3f}, {q['used']}/{q['total']} questions, {Path(q['file']).name}, "
        + ("loaded from a saved result)" if loaded else f"{record['seconds']:.0f} s)")
    )


def type_log_line(name: str, entry: dict[str, Any]) -> str:
    """One type's fit, or why the server-wide T serves it."""
    if entry["fallback"] is not None:
        return f"decision calibration ({name}): {entry['fallback']}, server-wide T applies"
    verdict = "kept" if entry["kept"] else "not kept, T=1.0"
    return (
        f"decision calibration ({name}): T={entry['temperature']:.2f} {verdict} (ECE {entry['ece_raw']:.3f} -> "
        f"{entry['ece_calibrated']:.3f}, {entry['used']} questions)"
    )
