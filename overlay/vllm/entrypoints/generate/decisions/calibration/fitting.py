# SPDX-License-Identifier: Apache-2.0
"""From a calibration pass's reads to its record, and the lines the record logs."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import vllm
from vllm.entrypoints.generate.decisions.calibration import bias, question_file
from vllm.entrypoints.generate.decisions.calibration.abstention import (
    question_thresholds,
    type_thresholds,
)
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import run_id
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    LabelledRead,
    TypeReads,
    question_key,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    Labelled,
    calibrate,
    rows_by_name,
)
from vllm.entrypoints.generate.decisions.calibration.question_map import question_maps
from vllm.entrypoints.generate.decisions.calibration.record import (
    CalibrationFailure,
    CalibrationRecord,
    Fit,
    Outcome,
    QuestionsUsed,
    TypeRecord,
)
from vllm.entrypoints.generate.decisions.decide.read_context import sha256_of
from vllm.entrypoints.generate.decisions.decide.reading.read import QuestionRead
from vllm.entrypoints.generate.decisions.decide.settings import AUTO, uses_fitted
from vllm.entrypoints.generate.decisions.decide.temperature import (
    FIRST_PASS,
    FULL,
    Temperatures,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

MIN_ANSWERED = 50  # for the server-wide fit, and for a question type's own


def fitted_record(
    by_layout: dict[str | None, list[Any]],
    questions: question_file.QuestionFile,
    prior: str,
    started: float,
    full: bool = True,
    precision: Mapping[str, float] | None = None,
) -> Outcome:
    """The record fitted on ``by_layout``'s readings, or why none is (``full``: not a first pass);
    arithmetic only, which the caller runs off the event loop."""
    for layout, answered in by_layout.items():
        if len(answered) < MIN_ANSWERED:
            return failed(
                warn=full,
                reason=f"only {len(answered)} of {len(questions.questions)} questions were answered "
                f"(need {MIN_ANSWERED})" + (f" with {layout} labels" if layout else ""),
            )
    reads = choose_reads(by_layout, prior)
    answered = as_chosen(by_layout, reads)
    read_ids = {id(item) for item, _ in answered}
    skipped = [item.id for item in questions.questions if id(item) not in read_ids]
    labelled = Labelled(
        [corrected_scores(item, read, reads) for item, read in answered],
        [item.correct for item, _ in answered],
        [item.group for item, _ in answered],
    )
    try:
        result = calibrate(labelled)
    except ValueError as exc:
        return failed(str(exc), full)
    # A first pass at the range's top, kept, is served: answers near uniform say the scores say next to
    # nothing until the full calibration decides (where an edge is a failure, as ever).
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
            lasting=True,
        )
    # Every type in the file, in file order: one with no answered question is reported as too few.
    names = dict.fromkeys(item.question.qtype.name for item in questions.questions)
    types = [item.question.qtype.name for item, _ in answered]
    applied = result.temperature if served_at_top else result.applied_temperature
    record = CalibrationRecord(
        **Fit.fields(result),
        applied_temperature=applied,
        by_type=type_fits(names, types, labelled, applied),
        reads=reads,
        questions=QuestionsUsed(
            file=questions.name,
            total=len(questions.questions),
            used=len(answered),
            skipped=skipped,
        ),
        seconds=round(time.monotonic() - started, 1),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        vllm_version=vllm.__version__,
        question_reads=sum(len(pairs) for pairs in by_layout.values()),
    )
    # Question maps; a type asked as one question has its fit already.
    temperatures = record.temperatures()
    keys = [question_key(item.question) for item, _ in answered]
    questions_of_type = Counter(kind for kind, _ in set(zip(types, keys, strict=True)))
    picked = [i for i, kind in enumerate(types) if questions_of_type[kind] > 1]

    scales = [
        map_scale(reads, temperatures, t, k) for t, k in zip(types, keys, strict=True)
    ]
    maps = question_maps(
        [keys[i] for i in picked], labelled.rows(picked), [scales[i] for i in picked]
    )
    # Each question labelled twice or more, kept for a labels file's refit to pool with.
    times = Counter(keys[i] for i in picked)
    pooled = [
        LabelledRead(
            state_sha256=sha256_of(answered[i][0].state),
            question=keys[i],
            scores=list(labelled.scores[i]),
            scale=scales[i],
            correct=labelled.correct[i],
            group=labelled.groups[i],
        )
        for i in picked
        if times[keys[i]] > 1
    ]
    asked = precision or {}
    chosen = {kind: asked.get(kind, asked.get("*")) for kind in names}
    precisions = {kind: value for kind, value in chosen.items() if value is not None}
    return record.model_copy(
        update={
            "question_maps": maps,
            "abstention": type_thresholds(types, labelled, precisions),
            "question_abstention": question_thresholds(
                keys, labelled, scales, maps, questions.precisions()
            ),
            "labelled": pooled,
        }
    )


def type_fits(
    names: Iterable[str], types: Sequence[str], labelled: Labelled, server: float
) -> dict[str, TypeRecord]:
    """A T per question type, as a model can be overconfident on choices and calibrated on yes/no;
    a type with too few answers, or whose fit fails or ends at an edge, gets the ``server`` T."""
    rows = rows_by_name(types)
    fits = {}
    for name in names:
        picked = rows.get(name, [])
        result, fallback = None, None
        if len(picked) < MIN_ANSWERED:
            fallback = f"too few questions ({len(picked)} < {MIN_ANSWERED})"
        else:
            try:
                result = calibrate(labelled.rows(picked))
            except ValueError as exc:
                fallback = str(exc)
        if result is not None and result.at_edge:
            fallback = (
                f"the fitted T={result.temperature:.3f} is at the edge of "
                f"[{LOW_TEMPERATURE}, {HIGH_TEMPERATURE:g}]"
            )
        own = result if fallback is None else None
        fits[name] = TypeRecord(
            **Fit.fields(result),
            applied_temperature=own.applied_temperature if own else server,
            used=len(picked),
            fallback=fallback,
        )
    return fits


def choose_reads(
    by_layout: dict[
        str | None, list[tuple[question_file.LabelledQuestion, QuestionRead]]
    ],
    prior: str,
) -> dict[str, TypeReads]:
    """Each type's layout and correction, and the own bias of a question labelled MIN_ANSWERED times."""
    samples: dict[str, dict[str | None, list[bias.Sample]]] = defaultdict(
        lambda: defaultdict(list)
    )
    asked: dict[tuple[str | None, str, str], list[bias.Sample]] = defaultdict(list)
    for layout, answered in by_layout.items():
        for item, read in answered:
            name, sample = item.question.qtype.name, as_sample(item, read)
            samples[name][layout].append(sample)
            asked[layout, name, question_key(item.question)].append(sample)
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
            own = bias.choose(rows, forced)
            if uses_fitted(own.mode):  # a question's own choice only of a fitted mode
                kind.questions[key] = own
    return reads


def map_scale(
    reads: dict[str, TypeReads], temperatures: Temperatures, kind: str, key: str
) -> float:
    """The scale a question's own map is pulled toward: 1 / the T its answers get without one."""
    own = reads[kind].questions.get(key) if kind in reads else None
    return 1.0 / (
        own.kept.temperature if own is not None else temperatures.for_type(kind).value
    )


def as_chosen(
    by_layout: dict[str | None, list[Any]], reads: dict[str, TypeReads]
) -> list[Any]:
    """Each type's (question, reading) pairs in its chosen layout (none chosen: the first layout)."""
    first = next(iter(by_layout))
    chosen = {name: choice.layout for name, choice in reads.items()}
    return [
        (item, read)
        for layout, pairs in by_layout.items()
        for item, read in pairs
        if layout == chosen.get(item.question.qtype.name, first)
    ]


def corrected_scores(
    item: question_file.LabelledQuestion,
    read: QuestionRead,
    reads: dict[str, TypeReads],
) -> list[float]:
    """The scores a server answering this question gives, under its correction."""
    kind = reads.get(item.question.qtype.name)
    if kind is None:
        return read.reading.scores
    choice = kind.for_question(question_key(item.question), kind.layout)[0]
    if choice is None or choice.mode == "off":
        return read.reading.scores
    return bias.corrected(as_sample(item, read), choice.mode, choice.kept.bias)


def as_sample(item: question_file.LabelledQuestion, read: QuestionRead) -> bias.Sample:
    return bias.Sample(
        read.rows, read.positions, read.priors, item.correct, item.group, item.id
    )


def log_lines(
    record: CalibrationRecord, loaded: bool, stage: str = FULL
) -> list[tuple[bool, str]]:
    """(is a warning, line) for each fit; a type whose own fit was refused is a warning."""
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
            (False, qmap.log_line(question_name(key)))
            for key, qmap in record.question_maps.items()
        ]
        + [
            (False, shown.log_line(question_name(key)))
            for key, shown in record.question_examples.items()
        ]
        + [
            (rule.threshold is None, rule.log_line(name))
            for name, rule in record.abstention.items()
        ]
        + [
            (rule.threshold is None, rule.log_line(question_name(key)))
            for key, rule in record.question_abstention.items()
        ]
    )
    if stage == FIRST_PASS:
        return [(refused, "decision first-pass " + line[9:]) for refused, line in lines]
    return lines


def question_name(key: str) -> str:
    """A question's type and instructions (question_key's first two), for log lines."""
    return "{}, {!r}".format(*json.loads(key)[:2])


def log(record: CalibrationRecord, loaded: bool, stage: str = FULL) -> None:
    for refused, line in log_lines(record, loaded, stage):
        (logger.warning if refused else logger.info)(line)


def failed(reason: str, warn: bool = True, lasting: bool = False) -> CalibrationFailure:
    """This run's failure; a ``lasting`` one (no fault a restart mends) spares later runs too."""
    if warn:
        logger.warning("decision calibration failed, T=1.0 (default): %s", reason)
    return CalibrationFailure(failed=reason, run=run_id(), lasting=lasting)
