# SPDX-License-Identifier: Apache-2.0
"""Startup calibration: run the question set through the loaded backend inside the server, choose each
question type's prior correction (bias.py: kept only where held-out log loss and accuracy say it
helps), fit a temperature for the server and one per question type on the corrected scores, keep each
only if held-out calibration error clearly improves (fitting.py), and save the result.

Failures never stop the server: they give T = 1.0 with source ``default`` and a warning naming the
cause. A saved result for the same deployment is loaded instead of measuring again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.calibration import (
    question_file,
    results,
    store,
)
from vllm.entrypoints.generate.decisions.decide.calibration.results import (
    CalibrationRecord,
)
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    AUTO,
    PriorSetting,
    uses_content_free,
)
from vllm.entrypoints.generate.decisions.decide.reading.corrections import Calibrated
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    PriorCache,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
)
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    Readiness,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    NO_DEBIAS,
    Debias,
    Settings,
)
from vllm.entrypoints.generate.decisions.decide.temperature import (
    DEFAULT,
    FIRST_PASS,
    FULL,
    Temperatures,
)
from vllm.entrypoints.generate.decisions.runtime.calibration_reads import (
    Earlier,
    announce,
    answered_by_layout,
    first_pass_questions,
    read_all,
    to_read,
)
from vllm.entrypoints.generate.decisions.runtime.deployment_lock import (
    once_per_server,
    save,
    this_run,
)
from vllm.entrypoints.generate.decisions.runtime.examples_pass import (
    ShownReader,
    with_examples,
)
from vllm.entrypoints.generate.decisions.runtime.fitting import (
    fitted_record,
    log,
)
from vllm.entrypoints.generate.decisions.runtime.live_labels import restored
from vllm.logger import init_logger

logger = init_logger(__name__)

# A first pass's fits are saved under their own name beside the full calibration's, for a restart to
# answer on while the full one reads (an earlier start's full calibration was cut short).
FIRST_PASS_KIND = "first-pass"


async def startup_calibration(
    backend: DecisionBackend,
    settings: Settings,
    deployment: dict[str, Any],
    progress: Readiness | None = None,
    first_pass: Callable[[Calibrated], None] | None = None,
) -> Calibrated:
    """The temperatures this server applies by default (server-wide and per question type) and each
    type's prior correction, measured (or loaded) now; ``progress`` hears how far the reads are, or
    that another API-server process is doing them. Where no full result is saved and
    ``VLLM_TYPED_DECISIONS_FIRST_PASS`` is on, ``first_pass`` is given a first pass's fits, while the
    full calibration (returned) reads on: an earlier start's saved first pass at once, else this
    start's as soon as it is fitted (and saved, so a stop before the full one ends loses no reads)."""
    if settings.calibration == "off":
        return Calibrated(Temperatures(DEFAULT))
    directory = Path(settings.calibration_dir)

    def early(record: dict[str, Any]) -> bool:
        """The first pass's fits saved and in force (``first_pass``), unless it failed or its T may
        not apply."""
        assert first_pass is not None
        if "failed" in record:
            logger.warning(
                "decision calibration, first pass: %s; decisions wait for the full calibration",
                record["failed"],
            )
            return False
        fits = CalibrationRecord.model_validate(record)
        if (problem := fits.temperature_problem(settings)) is not None:
            logger.warning(
                "decision calibration, first pass not applied (%s); decisions wait for the full "
                "calibration",
                problem,
            )
            return False
        save(directory, key, record, FIRST_PASS_KIND)
        log(fits, False, FIRST_PASS)
        first_pass(first_pass_calibrated(fits))
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
        first_pass(first_pass_calibrated(saved))
        answer_early = False
        progress = Readiness()
        progress.begin(f"{CALIBRATION} (full, in the background)")
    record, loaded = await once_per_server(
        directory,
        key,
        "calibration",
        settings.startup_wait,
        lambda: measure_and_fit(
            backend,
            questions,
            settings.debias,
            settings.prior,
            progress,
            early if answer_early else None,
            settings.precision,
            settings.examples,
        ),
        lambda saved: reusable(saved, settings),
        progress.waiting if progress is not None else None,
    )
    if "failed" in record:
        if loaded and this_run(record):
            logger.warning(
                "decision calibration failed in another API-server process of this server, "
                "T=1.0 (default): %s",
                record["failed"],
            )
        elif loaded:
            logger.warning(
                "decision calibration: the saved result for this deployment is a failure, "
                "T=1.0 (default): %s; delete %s to measure again",
                record["failed"],
                store.path_for(Path(settings.calibration_dir), key),
            )
        return Calibrated(Temperatures(DEFAULT))
    fits = CalibrationRecord.model_validate(record)
    if (
        problem := fits.temperature_problem(settings)
    ) is not None:  # a fresh fit the range refuses
        logger.warning("decision calibration not applied, T=1.0 (default): %s", problem)
        return Calibrated(Temperatures(DEFAULT))
    log(fits, loaded)
    return restored(
        Calibrated(
            fits.temperatures(),
            fits.reads,
            FULL,
            fits.question_reads,
            fits.question_maps,
            fits.abstention,
            key=key,
            examples=fits.kept_examples(),
            question_abstention=fits.question_abstention,
            labelled=tuple(fits.labelled),
        ),
        settings,
    )


def calibration_key(
    backend: DecisionBackend,
    settings: Settings,
    deployment: dict[str, Any],
    questions_sha256: str,
) -> dict[str, Any]:
    """Everything a calibration's reads depend on: the deployment (model files, tokenizer, chat template,
    vLLM; model_identity.py), the backend with all its options and what its startup check found, the
    prompt's render version, the self-check's threshold, the read settings and the question file."""
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
        "scheme": results.SCHEME,
        "debias": str(settings.debias),
        "prior": settings.prior,
        "precision": dict(settings.precision),
        "examples": settings.examples,
    }


def reusable(saved: dict[str, Any], settings: Settings) -> bool:
    """A saved fit that validates and whose temperatures the server's range admits, this run's failure,
    or an earlier run's lasting one (any other failure is measured again)."""
    if "failed" in saved:
        return this_run(saved) or saved.get("lasting") is True
    try:
        record = CalibrationRecord.model_validate(saved)
    except ValidationError as exc:
        logger.warning(
            "decision calibration: the saved result is malformed (%s), measuring again",
            exc.errors(include_url=False)[0],
        )
        return False
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
    """The first pass an earlier start saved for ``key`` (its full calibration cut short), to answer on
    at once; None where a full result is saved, which wins as ever, or no usable first pass is."""
    if store.load(directory, key) is not None:
        return None
    saved = store.load(directory, key, FIRST_PASS_KIND)
    if saved is None or "failed" in saved or not reusable(saved, settings):
        return None
    return CalibrationRecord.model_validate(saved)


def first_pass_calibrated(fits: CalibrationRecord) -> Calibrated:
    """A first pass's fits as answers apply them until the full calibration replaces them."""
    return Calibrated(
        fits.temperatures(),
        fits.reads,
        FIRST_PASS,
        fits.question_reads,
        fits.question_maps,
        fits.abstention,
        question_abstention=fits.question_abstention,
    )


async def measure_and_fit(
    backend: DecisionBackend,
    questions: question_file.QuestionFile,
    debias: Debias = NO_DEBIAS,
    prior: PriorSetting = "off",
    progress: Readiness | None = None,
    first_pass: Callable[[dict[str, Any]], bool] | None = None,
    precision: Mapping[str, float] | None = None,
    examples: int = 0,
) -> dict[str, Any]:
    """The calibration record for this deployment: the fits, or this run's failure. ``prior`` is the
    server's VLLM_TYPED_DECISIONS_PRIOR: auto chooses each type's correction, a mode is taken as set;
    ``precision`` VLLM_TYPED_DECISIONS_PRECISION, the precision asked of each type's answers;
    ``examples`` VLLM_TYPED_DECISIONS_EXAMPLES, the most in-context examples a labelled question is
    measured with (the full calibration's, after its fit; runtime/examples_pass.py).
    Each label layout the backend has is read and compared per type (bias.choose_layout).

    With ``first_pass``, a smaller pass comes first: about
    ``calibration_reads.FIRST_PASS_QUESTIONS`` questions (a share of each type), in the first layout
    only (the full pass compares the others), without content-free reads under auto (which only
    compares them). It is fitted by the same code and keep rule, handed to ``first_pass`` (True: now
    in force, so the full pass's progress goes to the log alone), and the full pass reuses its reads
    (none read twice)."""
    started = time.monotonic()
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
        record = await fitted_record(
            answered_by_layout(questions, rows, baseline),
            questions,
            baseline,
            prior,
            started,
            full=False,
            precision=precision,
        )
        if first_pass(record):
            progress = Readiness()
            progress.begin(f"{CALIBRATION} (full, in the background)")
    total = to_read(len(questions.questions), layouts, earlier, content_free)
    announce(
        questions, layouts, progress, reads=total if first_pass is not None else None
    )
    rows = await read_all(
        backend, questions, debias, correction, layouts, progress, earlier
    )
    by_layout = answered_by_layout(questions, rows, layouts)
    record = await fitted_record(
        by_layout, questions, layouts, prior, started, precision=precision
    )
    if examples and "failed" not in record:
        reader = ShownReader(backend, debias, prior)
        record = await with_examples(record, by_layout, layouts, examples, reader)
    return record
