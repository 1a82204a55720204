# SPDX-License-Identifier: Apache-2.0
"""Startup calibration: run the question set through the loaded backend inside the server, choose each
question type's prior correction (bias.py: kept only where held-out log loss and accuracy say it
helps), fit a temperature for the server and one per question type on the corrected scores, keep each
only if held-out calibration error clearly improves, and save the result.

Failures never stop the server: they give T = 1.0 with source ``default`` and a warning naming the
cause. A saved result for the same deployment is loaded instead of measuring again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.calibration import (
    bias,
    by_type,
    question_file,
    results,
)
from vllm.entrypoints.generate.decisions.decide.calibration.abstention import (
    type_thresholds,
)
from vllm.entrypoints.generate.decisions.decide.calibration.maths import calibrate
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    question_maps,
)
from vllm.entrypoints.generate.decisions.decide.calibration.results import (
    CalibrationRecord,
)
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    AUTO,
    uses_content_free,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.corrections import Calibrated
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    PriorCache,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import (
    QuestionRead,
    plan_read,
    with_content_free,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import (
    read as run_plan,
)
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    ESTIMATE_AFTER,
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
from vllm.entrypoints.generate.decisions.runtime.deployment_lock import (
    once_per_server,
    run_id,
    this_run,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

CONCURRENCY = 8
MIN_ANSWERED = 50  # for the server-wide fit, and for a question type's own


Row = list[QuestionRead | None]  # a question's readings, one per layout (None: failed)


async def measure(
    backend: DecisionBackend,
    questions: question_file.QuestionFile,
    debias: Debias = NO_DEBIAS,
    correction: Correction = NO_CORRECTION,
    layouts: tuple[str | None, ...] = (None,),
    progress: Readiness | None = None,
) -> dict[str | None, list[Any]]:
    """Each layout's readings of the questions, in file order (:func:`read_all`); failed reads are
    left out."""
    rows = await read_all(backend, questions, debias, correction, layouts, progress)
    return answered_by_layout(questions, rows, layouts)


async def read_all(
    backend: DecisionBackend,
    questions: question_file.QuestionFile,
    debias: Debias = NO_DEBIAS,
    correction: Correction = NO_CORRECTION,
    layouts: tuple[str | None, ...] = (None,),
    progress: Readiness | None = None,
    earlier: dict[int, Row] | None = None,
    only: Collection[int] | None = None,
) -> list[Row]:
    """Each question's reading in each layout, read as requests are (``debias``, the backend's options
    in that layout; with ``correction``'s content-free reads when it asks for them), ``CONCURRENCY``
    questions at a time. A question's layouts are read one after the other, so the later ones find the
    prompt they share with the first (template, state, criterion) in the engine's prefix cache.

    ``only``: the questions (by index) to read, the others left unread (None). ``earlier``: the first
    pass's rows by question; each reading is taken as it is (given its content-free reads where
    ``correction`` asks for them), and one that failed is not read again. Each read that goes to the
    engine, answered or not, advances ``progress``."""
    gate = asyncio.Semaphore(CONCURRENCY)
    options = {
        layout: backend.with_layout(backend.options, layout) for layout in layouts
    }
    content_free = uses_content_free(correction.mode)
    before: Row = [None] * len(layouts)

    async def read_item(
        index: int, item: question_file.LabelledQuestion, column: int
    ) -> QuestionRead | None:
        layout = layouts[column]
        reused = earlier.get(index) if earlier is not None else None
        if reused is not None and (reused[column] is None or not content_free):
            return reused[column]
        try:
            context = ReadContext.about(
                item.state, request_id(index, layout, layouts), options[layout]
            )
            plan = plan_read(backend, item.question, context, debias, correction)
            if reused is not None and (kept := reused[column]) is not None:
                return await with_content_free(plan, kept)
            return await run_plan(plan)
        except DecisionError as exc:
            logger.debug(
                "calibration question %s skipped%s: %s",
                item.id,
                f" ({layout} labels)" if layout else "",
                exc.message,
            )
            return None
        finally:
            if progress is not None:
                progress.advance()

    async def one(index: int, item: question_file.LabelledQuestion) -> Row:
        if only is not None and index not in only:
            return list(before)
        async with gate:
            return [
                await read_item(index, item, column) for column in range(len(layouts))
            ]

    return list(
        await asyncio.gather(*(one(i, q) for i, q in enumerate(questions.questions)))
    )


def first_pass_questions(questions: question_file.QuestionFile) -> list[int]:
    """The questions a first pass reads: every other one of each type, in file order (half the set,
    each type's share kept)."""
    seen: dict[str, int] = {}
    chosen = []
    for index, item in enumerate(questions.questions):
        name = item.question.qtype.name
        if seen.setdefault(name, 0) % 2 == 0:
            chosen.append(index)
        seen[name] += 1
    return chosen


def to_read(
    questions: int,
    layouts: tuple[str | None, ...],
    earlier: dict[int, Row],
    content_free: bool,
) -> int:
    """How many reads :func:`read_all` sends to the engine, given the first pass's ``earlier``."""
    again = (
        sum(r is not None for row in earlier.values() for r in row)
        if content_free
        else 0
    )
    return (questions - len(earlier)) * len(layouts) + again


def answered_by_layout(
    questions: question_file.QuestionFile,
    rows: list[Row],
    layouts: tuple[str | None, ...],
) -> dict[str | None, list[Any]]:
    """Each layout's (question, reading) pairs, in file order, failed reads left out."""
    return {
        layout: [
            (item, row[column])
            for item, row in zip(questions.questions, rows, strict=True)
            if row[column] is not None
        ]
        for column, layout in enumerate(layouts)
    }


def request_id(index: int, layout: str | None, layouts: tuple[str | None, ...]) -> str:
    """The engine's name for a calibration read: the question's index, and its layout where several are read."""
    return f"decision-calibration-{index}" + (
        f"-{layout}" if len(layouts) > 1 and layout is not None else ""
    )


async def startup_calibration(
    backend: DecisionBackend,
    settings: Settings,
    deployment: dict[str, Any],
    progress: Readiness | None = None,
    first_pass: Callable[[Calibrated], None] | None = None,
) -> Calibrated:
    """The temperatures this server applies by default (server-wide and per question type) and each
    type's prior correction, measured (or loaded) now; ``progress`` hears how far the reads are, or
    that another API-server process is doing them. Where this process measures (no saved result) and
    ``VLLM_TYPED_DECISIONS_FIRST_PASS`` is on, ``first_pass`` is given the first pass's fits as soon as
    they are made, while the full calibration (returned) reads on."""
    if settings.calibration == "off":
        return Calibrated(Temperatures(DEFAULT))

    def early(record: dict[str, Any]) -> bool:
        """The first pass's fits in force (``first_pass``), unless it failed or its T may not apply."""
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
        log(fits, False, FIRST_PASS)
        first_pass(
            Calibrated(
                fits.temperatures(),
                fits.reads,
                FIRST_PASS,
                fits.question_reads,
                fits.question_maps,
                fits.abstention,
            )
        )
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
    record, loaded = await once_per_server(
        Path(settings.calibration_dir),
        key,
        "calibration",
        settings.startup_wait,
        lambda: measure_and_fit(
            backend,
            questions,
            settings.debias,
            settings.prior,
            progress,
            early if first_pass is not None and settings.first_pass else None,
            settings.precision,
        ),
        lambda saved: reusable(saved, settings),
        progress.waiting if progress is not None else None,
    )
    if "failed" in record:
        if loaded:
            logger.warning(
                "decision calibration failed in another API-server process of this server, "
                "T=1.0 (default): %s",
                record["failed"],
            )
        return Calibrated(Temperatures(DEFAULT))
    fits = CalibrationRecord.model_validate(record)
    if (
        problem := fits.temperature_problem(settings)
    ) is not None:  # a fresh fit the range refuses
        logger.warning("decision calibration not applied, T=1.0 (default): %s", problem)
        return Calibrated(Temperatures(DEFAULT))
    log(fits, loaded)
    return Calibrated(
        fits.temperatures(),
        fits.reads,
        FULL,
        fits.question_reads,
        fits.question_maps,
        fits.abstention,
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
    }


def reusable(saved: dict[str, Any], settings: Settings) -> bool:
    """A saved fit that validates and whose temperatures the server's range admits, or this run's failure
    (an earlier run's failure is tried again)."""
    if "failed" in saved:
        return this_run(saved)
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


async def measure_and_fit(
    backend: DecisionBackend,
    questions: question_file.QuestionFile,
    debias: Debias = NO_DEBIAS,
    prior: str = "off",
    progress: Readiness | None = None,
    first_pass: Callable[[dict[str, Any]], bool] | None = None,
    precision: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The calibration record for this deployment: the fits, or this run's failure. ``prior`` is the
    server's VLLM_TYPED_DECISIONS_PRIOR: auto chooses each type's correction, a mode is taken as set;
    ``precision`` VLLM_TYPED_DECISIONS_PRECISION, the precision asked of each type's answers.
    Each label layout the backend has is read and compared per type (bias.choose_layout).

    With ``first_pass``, a smaller pass comes first: every other question of each type in every
    layout, without content-free reads under auto (which only compares them). It is fitted by the same
    code and keep rule, handed to ``first_pass`` (True: now in force, so the full pass's progress goes
    to the log alone), and the full pass reuses its reads (none read twice)."""
    started = time.monotonic()
    layouts = backend.compared_layouts() or (None,)
    content_free = prior == AUTO or uses_content_free(prior)
    # Its own cache: the calibration's neutral reads are not kept for the requests.
    cache = PriorCache(len(questions.questions) * len(layouts))
    correction = Correction("content-free", cache) if content_free else NO_CORRECTION
    early = correction if prior != AUTO else NO_CORRECTION
    earlier: dict[int, Row] = {}
    if first_pass is not None:
        subset = first_pass_questions(questions)
        announce(
            questions, layouts, progress, len(subset), uses_content_free(early.mode)
        )
        rows = await read_all(
            backend, questions, debias, early, layouts, progress, only=subset
        )
        earlier = {index: rows[index] for index in subset}
        record = await fitted_record(
            answered_by_layout(questions, rows, layouts),
            questions,
            layouts,
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
    return await fitted_record(
        answered_by_layout(questions, rows, layouts),
        questions,
        layouts,
        prior,
        started,
        precision=precision,
    )


async def fitted_record(
    by_layout: dict[str | None, list[Any]],
    questions: question_file.QuestionFile,
    layouts: tuple[str | None, ...],
    prior: str,
    started: float,
    full: bool = True,
    precision: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The calibration record fitted on ``by_layout``'s readings, or why none is (:func:`failed`;
    ``full``: the full calibration's, not a first pass's)."""
    for layout, answered in by_layout.items():
        if len(answered) < MIN_ANSWERED:
            return failed(
                warn=full,
                reason=f"only {len(answered)} of {len(questions.questions)} questions were answered "
                f"(need {MIN_ANSWERED})" + (f" with {layout} labels" if layout else ""),
            )
    reads = await asyncio.to_thread(choose_reads, by_layout, prior)
    # Each type's questions as its chosen layout read them (the first layout's for a type with no choice).
    answered = [
        (item, read)
        for layout, pairs in by_layout.items()
        for item, read in pairs
        if layout == chosen_layout(reads, item.question.qtype.name, layouts[0])
    ]
    read_ids = {id(item) for item, _ in answered}
    skipped = [item.id for item in questions.questions if id(item) not in read_ids]
    scores = [corrected_scores(item, read, reads) for item, read in answered]
    correct = [item.correct for item, _ in answered]
    groups = [item.group for item, _ in answered]
    try:
        result = await asyncio.to_thread(calibrate, scores, correct, groups)
    except ValueError as exc:
        return failed(str(exc), full)
    # A first pass at the range's top, kept by the keep rule, is served: on half the set the scores say
    # next to nothing, and answers near uniform say so until the full calibration decides on all of it
    # (an edge there is a failure, as ever).
    served_at_top = not full and result.at_top and result.kept
    if served_at_top:
        logger.warning(
            "decision calibration, first pass: the fitted T=%.3f is at the top of [0.05, 20]: "
            "the model's scores say next to nothing on these questions, so answers are near uniform "
            "until the full calibration",
            result.temperature,
        )
    elif result.at_edge:
        return failed(
            f"the fitted T={result.temperature:.3f} is at the edge of [0.05, 20], which points to "
            "broken scores",
            full,
        )
    # Every type in the file, in file order: one with no answered question is reported as too few.
    names = dict.fromkeys(item.question.qtype.name for item in questions.questions)
    types = [item.question.qtype.name for item, _ in answered]
    fits = await asyncio.to_thread(
        by_type.fit_types, names, types, scores, correct, groups, MIN_ANSWERED
    )
    record = CalibrationRecord.of(
        result,
        fits,
        reads,
        questions,
        len(answered),
        skipped,
        time.monotonic() - started,
        sum(len(pairs) for pairs in by_layout.values()),
        applied=result.temperature if served_at_top else None,
    )
    # Each question labelled often enough may get a map of its own, pulled toward the T its answers
    # get without one: its own correction's where it has one, else its type's. A type asked as one
    # question has its fit already.
    temperatures = record.temperatures()
    keys = [bias.question_key(item.question) for item, _ in answered]
    asked = {
        kind: {k for k, t in zip(keys, types, strict=True) if t == kind}
        for kind in types
    }
    picked = [i for i, kind in enumerate(types) if len(asked[kind]) > 1]

    def scale(i: int) -> float:
        kind = types[i]
        own = reads[kind].questions.get(keys[i]) if kind in reads else None
        return 1.0 / (
            own.kept.temperature
            if own is not None
            else temperatures.for_type(kind).value
        )

    maps = await asyncio.to_thread(
        question_maps,
        [keys[i] for i in picked],
        [scores[i] for i in picked],
        [correct[i] for i in picked],
        [groups[i] for i in picked],
        [scale(i) for i in picked],
    )
    # Where the operator asked a type for a precision: the confidence threshold that reaches it.
    precisions = {
        kind: value
        for kind in names
        if (value := (precision or {}).get(kind, (precision or {}).get("*")))
        is not None
    }
    abstention = await asyncio.to_thread(
        type_thresholds, types, scores, correct, groups, precisions
    )
    return record.model_copy(
        update={"question_maps": maps, "abstention": abstention}
    ).model_dump(mode="json")


def announce(
    questions: question_file.QuestionFile,
    layouts: tuple[str | None, ...],
    progress: Readiness | None,
    first_pass: int | None = None,
    content_free: bool = False,
    reads: int | None = None,
) -> None:
    """The line that says a calibration pass has started, what it reads and (once its first reads tell)
    how long it takes: progress lines follow every ``readiness.LOG_EVERY_S`` seconds. ``first_pass``:
    this is a first pass of that many questions (``content_free``: with their content-free reads);
    ``reads``: what the full pass sends to the engine after one."""
    count = len(questions.questions) if first_pass is None else first_pass
    named = [layout for layout in layouts if layout is not None]
    everything = count * len(layouts)
    how = f"{count} questions in {len(named)} label layouts ({', '.join(named)}), {everything} reads in all"
    if not named:
        how = f"{everything} questions"
    units = "reads"
    if first_pass is not None:
        how = (
            f"a first pass: {how}"
            f"{'' if content_free else ' without content-free reads'} (every other question of "
            "each type; answers start when it is fitted)"
        )
        units = "first-pass reads"
    if reads is not None:
        how += (
            f"; after the first pass, {reads} to go (its reads reused, given their content-free "
            "reads where they are compared)"
        )
        everything = reads
    logger.info(
        "decision calibration: reading %s; time left unknown until the first %d reads",
        how,
        min(ESTIMATE_AFTER, everything),
    )
    if progress is not None:
        progress.count(everything, units)


def choose_reads(
    by_layout: dict[
        str | None, list[tuple[question_file.LabelledQuestion, QuestionRead]]
    ],
    prior: str,
) -> dict[str, bias.TypeReads]:
    """Each type's layout and correction: under auto the ones held-out figures keep (bias.choose,
    bias.choose_layout), else the mode set, with every one's figures either way; types with too few
    questions get none (the first layout, no correction). In the layout kept, a question the file
    labels at least MIN_ANSWERED times may get a fitted bias of its own (bias.choose_per_question)."""
    samples: dict[str, dict[str | None, list[bias.Sample]]] = {}
    asked: dict[tuple[str | None, str, str], list[bias.Sample]] = {}
    for layout, answered in by_layout.items():
        for item, read in answered:
            sample = bias.Sample(
                read.rows,
                read.positions,
                read.priors,
                item.correct,
                item.group,
                item.id,
            )
            samples.setdefault(item.question.qtype.name, {}).setdefault(
                layout, []
            ).append(sample)
            asked.setdefault(
                (layout, item.question.qtype.name, bias.question_key(item.question)), []
            ).append(sample)
    forced = None if prior == AUTO else prior
    reads = {
        name: bias.choose_layout(
            {layout: bias.choose(rows, forced) for layout, rows in layouts.items()}
        )
        for name, layouts in samples.items()
        if all(len(rows) >= MIN_ANSWERED for rows in layouts.values())
        and len(layouts) == len(by_layout)
    }
    for (layout, name, key), rows in asked.items():
        kind = reads.get(name)
        # A type asked as one question has its fit already.
        if (
            kind is not None
            and kind.layout == layout
            and MIN_ANSWERED <= len(rows) < len(samples[name][layout])
        ):
            own = bias.choose_per_question(rows, forced)
            if own is not None:
                kind.questions[key] = own
    return reads


def chosen_layout(
    reads: dict[str, bias.TypeReads], qtype: str, first: str | None
) -> str | None:
    choice = reads.get(qtype)
    return choice.layout if choice is not None else first


def corrected_scores(
    item: question_file.LabelledQuestion,
    read: QuestionRead,
    reads: dict[str, bias.TypeReads],
) -> list[float]:
    """The scores a server answering this question gives: its reading under its correction (the
    question's own, else its type's)."""
    kind = reads.get(item.question.qtype.name)
    choice = (
        kind.for_question(bias.question_key(item.question), kind.layout)[0]
        if kind is not None
        else None
    )
    if choice is None or choice.mode == "off":
        return read.reading.scores
    sample = bias.Sample(
        read.rows, read.positions, read.priors, item.correct, item.group
    )
    return bias.corrected(sample, choice.mode, choice.kept.bias)


def log_lines(
    record: CalibrationRecord, loaded: bool, stage: str = FULL
) -> list[tuple[bool, str]]:
    """(is a warning, line): each type's reads, the server-wide line, then one per question type; a
    type whose own fit was refused (not merely too few questions) is a warning. A first pass's lines
    say so ("decision first-pass calibration: ...")."""
    lines = (
        [
            (False, line)
            for name, choice in record.reads.items()
            for line in choice.log_lines(name)
        ]
        + [(False, record.log_line(loaded))]
        + [
            (
                entry.fallback is not None and entry.used >= MIN_ANSWERED,
                entry.log_line(name),
            )
            for name, entry in record.by_type.items()
        ]
        + [
            (False, qmap.log_line("{}, {!r}".format(*json.loads(key)[:2])))
            for key, qmap in record.question_maps.items()
        ]
        + [
            (rule.threshold is None, rule.log_line(name))
            for name, rule in record.abstention.items()
        ]
    )
    if stage == FIRST_PASS:
        return [(refused, "decision first-pass " + line[9:]) for refused, line in lines]
    return lines


def log(record: CalibrationRecord, loaded: bool, stage: str = FULL) -> None:
    for refused, line in log_lines(record, loaded, stage):
        (logger.warning if refused else logger.info)(line)


def failed(reason: str, warn: bool = True) -> dict[str, Any]:
    """This run's failure, saved so the other API-server processes of this server don't measure again
    (a restart does); the server applies T = 1.0 (default). ``warn``: say so (a first pass's failure
    is said where it is taken, since the full calibration follows)."""
    if warn:
        logger.warning("decision calibration failed, T=1.0 (default): %s", reason)
    return {"failed": reason, "run": run_id()}
