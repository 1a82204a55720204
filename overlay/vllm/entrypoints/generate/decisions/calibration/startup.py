# SPDX-License-Identifier: Apache-2.0
"""Startup calibration: run the question set through the loaded backend inside the server, fit one
temperature, keep it only if held-out calibration error clearly improves, and save the result.

Failures never stop the server: they give T = 1.0 with source ``default`` and a warning naming the
cause. A saved result for the same deployment is loaded instead of measuring again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.logger import init_logger

from ..backends import DecisionBackend
from ..deployment_lock import exclusive, run_id
from ..errors import DecisionError
from ..settings import PREFIX, Settings
from . import question_file, store
from .maths import CalibrationResult, calibrate

logger = init_logger(__name__)

CONCURRENCY = 8
MIN_ANSWERED = 50


@dataclass(frozen=True)
class Temperature:
    value: float
    source: str  # "calibrated" or "default"


DEFAULT = Temperature(1.0, "default")


async def measure(backend: DecisionBackend, questions: question_file.QuestionFile) -> tuple[list[Any], list[str]]:
    """Each question's raw option scores, ``CONCURRENCY`` reads at a time; failed reads are skipped."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int, item: question_file.LabelledQuestion) -> Any:
        async with gate:
            try:
                return item, await backend.read(item.state, item.question, f"decision-calibration-{index}")
            except DecisionError as exc:
                logger.debug("calibration question %s skipped: %s", item.id, exc.message)
                return item, None

    results = await asyncio.gather(*(one(i, q) for i, q in enumerate(questions.questions)))
    answered = [(item, reading) for item, reading in results if reading is not None]
    skipped = [item.id for item, reading in results if reading is None]
    return answered, skipped


def summary(result: CalibrationResult, questions: question_file.QuestionFile, answered: int, skipped: list[str],
            seconds: float) -> dict[str, Any]:  # fmt: skip
    import vllm

    return {
        "temperature": result.temperature,
        "kept": result.kept,
        "applied_temperature": result.applied_temperature,
        "ece_raw": result.ece_raw,
        "ece_raw_interval": list(result.ece_raw_interval),
        "ece_calibrated": result.ece_calibrated,
        "ece_calibrated_interval": list(result.ece_calibrated_interval),
        "questions": {"file": questions.name, "total": len(questions.questions), "used": answered, "skipped": skipped},
        "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vllm_version": vllm.__version__,
    }


def log_line(record: dict[str, Any], loaded: bool) -> str:
    q = record["questions"]
    verdict = "kept" if record["kept"] else "not kept, T=1.0"
    return (
        f"decision calibration: T={record['temperature']:.2f} {verdict} (ECE {record['ece_raw']:.3f} -> "
        f"{record['ece_calibrated']:.3f}, {q['used']}/{q['total']} questions, {Path(q['file']).name}, "
        + ("loaded from a saved result)" if loaded else f"{record['seconds']:.0f} s)")
    )


async def startup_calibration(backend: DecisionBackend, settings: Settings, deployment: dict[str, Any]) -> Temperature:
    """The temperature this server applies by default, measured (or loaded) now."""
    if settings.calibration == "off":
        return DEFAULT
    source = question_file.BUNDLED if settings.calibration == "on" else settings.calibration
    try:
        questions = question_file.load(source)
    except question_file.QuestionFileError as exc:
        logger.warning("decision calibration skipped, T=1.0 (default): question file: %s", exc)
        return DEFAULT
    key = {**deployment, "backend": backend.name, "backend_args": dict(settings.backend.args),
           "render_version": backend.render_version, "questions_sha256": questions.sha256}  # fmt: skip
    directory = Path(settings.calibration_dir)
    # With several API-server processes, one calibrates and the others load what it saved.
    async with exclusive(store.lock_path(directory, key), settings.startup_wait, "calibration"):
        return await calibrate_or_load(backend, questions, directory, key)


async def calibrate_or_load(backend: DecisionBackend, questions: question_file.QuestionFile, directory: Path,
                            key: dict[str, Any]) -> Temperature:  # fmt: skip
    saved = store.load(directory, key)
    if saved is not None and "failed" in saved:
        if saved.get("run") == run_id():
            logger.warning("decision calibration failed in another API-server process of this server, "
                           "T=1.0 (default): %s", saved["failed"])  # fmt: skip
            return DEFAULT
        saved = None  # an earlier run's failure: try again
    if saved is not None:
        logger.info(log_line(saved, loaded=True))
        return Temperature(saved["applied_temperature"], "calibrated")
    started = time.monotonic()
    answered, skipped = await measure(backend, questions)
    if len(answered) < MIN_ANSWERED:
        return failed(directory, key, f"only {len(answered)} of {len(questions.questions)} questions were "
                                      f"answered (need {MIN_ANSWERED})")  # fmt: skip
    scores = [reading.scores for _, reading in answered]
    correct = [item.correct for item, _ in answered]
    groups = [item.group for item, _ in answered]
    try:
        result = await asyncio.to_thread(calibrate, scores, correct, groups)
    except ValueError as exc:
        return failed(directory, key, str(exc))
    if result.at_edge:
        return failed(directory, key, f"the fitted T={result.temperature:.3f} is at the edge of [0.05, 20], "
                                      "which points to broken scores")  # fmt: skip
    record = summary(result, questions, len(answered), skipped, time.monotonic() - started)
    try:
        path = store.save(directory, key, record)
        logger.info("decision calibration saved to %s", path)
    except OSError as exc:
        logger.warning("decision calibration not saved (%s=%s): %s", PREFIX + "CALIBRATION_DIR", directory, exc)
    logger.info(log_line(record, loaded=False))
    return Temperature(result.applied_temperature, "calibrated")


def failed(directory: Path, key: dict[str, Any], reason: str) -> Temperature:
    """The default temperature, saved as this run's outcome so the other API-server processes of this
    server don't measure again (a restart does)."""
    logger.warning("decision calibration failed, T=1.0 (default): %s", reason)
    with contextlib.suppress(OSError):
        store.save(directory, key, {"failed": reason, "run": run_id()})
    return DEFAULT
