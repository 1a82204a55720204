# SPDX-License-Identifier: Apache-2.0
"""Startup calibration, measured or loaded. Failures never stop the server: they give T = 1.0 (source
``default``) and a warning naming the cause."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import (
    load,
    once_per_server,
    path_for,
    save,
    this_run,
)
from vllm.entrypoints.generate.decisions.calibration.examples import (
    ShownReader,
    with_examples,
)
from vllm.entrypoints.generate.decisions.calibration.fitting import fitted_record, log
from vllm.entrypoints.generate.decisions.calibration.in_force import Calibrated
from vllm.entrypoints.generate.decisions.calibration.live_labels import restored
from vllm.entrypoints.generate.decisions.calibration.reads import (
    CONCURRENCY,
    WHILE_ANSWERING,
    Earlier,
    announce,
    answered_by_layout,
    first_pass_questions,
    read_all,
    to_read,
)
from vllm.entrypoints.generate.decisions.calibration.record import (
    SCHEME,
    CalibrationFailure,
    CalibrationRecord,
    Outcome,
    saved_outcome,
)
from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.reading.prior import PriorCache
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
)
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    Readiness,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    AUTO,
    Settings,
    uses_content_free,
)
from vllm.entrypoints.generate.decisions.decide.temperature import (
    DEFAULT,
    FIRST_PASS,
    FULL,
    Temperatures,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

# A first pass's fits, saved beside the full calibration's for a restart to answer on while the full
# one reads (an earlier start's was cut short).
FIRST_PASS_KIND = "first-pass"


async def startup_calibration(
    backend: DecisionBackend,
    settings: Settings,
    deployment: dict[str, Any],
    progress: Readiness | None = None,
    first_pass: Callable[[Calibrated], None] | None = None,
) -> Calibrated:
    """The calibration this server applies; ``first_pass`` is given a first pass's fits (saved, so a
    stop before the full one ends loses no reads) while the full calibration reads on."""
    if settings.calibration == "off":
        return Calibrated(Temperatures(DEFAULT))
    directory = Path(settings.calibration_dir)

    def early(outcome: Outcome) -> bool:
        """The first pass's fits saved and in force, unless it failed or its T may not apply."""
        assert first_pass is not None
        if isinstance(outcome, CalibrationFailure):
            logger.warning(
                "decision calibration, first pass: %s; decisions wait for the full calibration",
                outcome.failed,
            )
            return False
        if (problem := outcome.temperature_problem(settings)) is not None:
            logger.warning(
                "decision calibration, first pass not applied (%s); decisions wait for the full "
                "calibration",
                problem,
            )
            return False
        save(directory, key, outcome.model_dump(mode="json"), FIRST_PASS_KIND)
        log(outcome, False, FIRST_PASS)
        first_pass(calibrated(outcome))
        return True

    source = (
        question_file.BUNDLED if settings.calibration == "on" else settings.calibration
    )
    try:
        questions = question_file.load(source)
    except question_file.QuestionFileError as exc:
        logger.warning(
            "decision calibration skipped, T=1.0 (default): question file: %s", exc
        )
        return Calibrated(Temperatures(DEFAULT))
    key = calibration_key(backend, settings, deployment, questions.sha256)
    answer_early = first_pass is not None and settings.first_pass
    saved = saved_first_pass(directory, key, settings) if answer_early else None
    if saved is not None:
        # Every API-server process answers on it now; one of them measures the full calibration.
        assert first_pass is not None
        log(saved, True, FIRST_PASS)
        first_pass(calibrated(saved))
        answer_early = False
        progress = in_background()

    async def measured() -> dict[str, Any]:
        first = early if answer_early else None
        outcome = await measure_and_fit(
            backend, questions, settings, progress, first, saved is not None
        )
        return outcome.model_dump(mode="json")

    record, loaded = await once_per_server(
        directory,
        key,
        "calibration",
        settings.startup_wait,
        measured,
        lambda saved: reusable(saved, settings),
        progress.waiting if progress is not None else None,
    )
    fits = saved_outcome(record)
    if isinstance(fits, CalibrationFailure):
        if loaded and this_run(record):
            logger.warning(
                "decision calibration failed in another API-server process of this server, "
                "T=1.0 (default): %s",
                fits.failed,
            )
        elif loaded:
            logger.warning(
                "decision calibration: the saved result for this deployment is a failure, "
                "T=1.0 (default): %s; delete %s to measure again",
                fits.failed,
                path_for(Path(settings.calibration_dir), key),
            )
        return Calibrated(Temperatures(DEFAULT))
    if (problem := fits.temperature_problem(settings)) is not None:
        logger.warning("decision calibration not applied, T=1.0 (default): %s", problem)
        return Calibrated(Temperatures(DEFAULT))
    log(fits, loaded)
    full = replace(
        calibrated(fits, FULL),
        key=key,
        examples={k: v for k, v in fits.question_examples.items() if v.kept},
        labelled=tuple(fits.labelled),
    )
    return restored(full, settings)


def calibration_key(
    backend: DecisionBackend,
    settings: Settings,
    deployment: dict[str, Any],
    questions_sha256: str,
) -> dict[str, Any]:
    """Everything a calibration's reads depend on."""
    options = (
        backend.options.model_dump(mode="json")
        if isinstance(backend.options, BaseModel)
        else backend.options
    )
    return {
        **deployment,
        "backend": backend.name,
        "backend_args": dict(settings.backend.args),
        "backend_options": options,
        "reads": backend.read_key(),
        "render_version": backend.render_version,
        "min_option_mass": settings.min_option_mass,
        "questions_sha256": questions_sha256,
        "scheme": SCHEME,
        "debias": str(settings.debias),
        "prior": settings.prior,
        "precision": dict(settings.precision),
        "examples": settings.examples,
    }


def reusable(saved: dict[str, Any], settings: Settings) -> bool:
    """A valid saved fit the range admits, this run's failure, or an earlier run's lasting one."""
    try:
        record = saved_outcome(saved)
    except ValidationError as exc:
        logger.warning(
            "decision calibration: the saved result is malformed (%s), measuring again",
            exc.errors(include_url=False)[0],
        )
        return False
    if isinstance(record, CalibrationFailure):
        return this_run(saved) or record.lasting
    if (problem := record.temperature_problem(settings)) is not None:
        logger.warning(
            "decision calibration: the saved result is not reused (%s), measuring again",
            problem,
        )
        return False
    return True


def saved_first_pass(
    directory: Path, key: dict[str, Any], settings: Settings
) -> CalibrationRecord | None:
    """The first pass an earlier start saved, unless a full result is."""
    if load(directory, key) is not None:
        return None
    saved = load(directory, key, FIRST_PASS_KIND)
    if saved is None or "failed" in saved or not reusable(saved, settings):
        return None
    return CalibrationRecord.model_validate(saved)


def calibrated(fits: CalibrationRecord, stage: str = FIRST_PASS) -> Calibrated:
    """The fits as answers apply them (a first pass's, or the full one's without what only it has)."""
    return Calibrated(
        fits.temperatures(),
        stage,
        fits.question_reads,
        fits.reads,
        fits.question_maps,
        fits.abstention,
        question_abstention=fits.question_abstention,
    )


def in_background() -> Readiness:
    """The full calibration's progress, once a first pass answers: to the log alone."""
    progress = Readiness()
    progress.begin(f"{CALIBRATION} (full, in the background)")
    return progress


async def measure_and_fit(
    backend: DecisionBackend,
    questions: question_file.QuestionFile,
    settings: Settings,
    progress: Readiness | None = None,
    first_pass: Callable[[Outcome], bool] | None = None,
    answering: bool = False,
) -> Outcome:
    """The fits, or this run's failure. A ``first_pass`` reads the first layout only, without
    content-free reads under auto (which only compares them); the full pass reuses its reads, one at a
    time once decisions are ``answering`` on a first pass."""
    started = time.monotonic()
    debias, prior, precision = settings.debias, settings.prior, settings.precision
    layouts = backend.compared_layouts() or (None,)
    content_free = prior == AUTO or uses_content_free(prior)
    # Its own cache: the calibration's neutral reads are not kept for the requests.
    cache = PriorCache(len(questions.questions) * len(layouts))
    correction = Correction("content-free", cache) if content_free else NO_CORRECTION
    early = correction if prior != AUTO else NO_CORRECTION
    earlier: Earlier = {}
    if first_pass is not None:
        subset = first_pass_questions(questions)
        baseline = layouts[:1]
        announce(
            questions, baseline, progress, len(subset), uses_content_free(early.mode)
        )
        rows = await read_all(
            backend, questions, debias, early, baseline, progress, only=subset
        )
        earlier = {(index, 0): rows[index][0] for index in subset}
        answered = answered_by_layout(questions, rows, baseline)
        record = await asyncio.to_thread(
            fitted_record, answered, questions, prior, started, False, precision
        )
        if first_pass(record):
            progress, answering = in_background(), True
    total = to_read(len(questions.questions), layouts, earlier, content_free)
    announce(
        questions, layouts, progress, reads=total if first_pass is not None else None
    )
    at_once = WHILE_ANSWERING if answering else CONCURRENCY
    rows = await read_all(
        backend, questions, debias, correction, layouts, progress, earlier, at_once
    )
    by_layout = answered_by_layout(questions, rows, layouts)
    record = await asyncio.to_thread(
        fitted_record, by_layout, questions, prior, started, True, precision
    )
    if settings.examples and isinstance(record, CalibrationRecord):
        reader = ShownReader(backend, debias, prior, at_once)
        record = await with_examples(record, by_layout, settings.examples, reader)
    return record
