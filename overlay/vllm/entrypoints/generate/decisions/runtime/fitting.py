# SPDX-License-Identifier: Apache-2.0
"""From a calibration's reads to its record: each type's layout and prior correction (bias.py), the
server-wide and per-type temperatures (maths.py, by_type.py), each labelled question's own map
(question_map.py) and each type's abstention threshold (abstention.py); and the lines the record logs.
calibration.py runs the reads and calls this once per pass."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from vllm.entrypoints.generate.decisions.decide.calibration import (
    bias,
    by_type,
    question_file,
)
from vllm.entrypoints.generate.decisions.decide.calibration.abstention import (
    question_thresholds,
    type_thresholds,
)
from vllm.entrypoints.generate.decisions.decide.calibration.maths import calibrate
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    LabelledRead,
    question_maps,
)
from vllm.entrypoints.generate.decisions.decide.calibration.results import (
    CalibrationRecord,
)
from vllm.entrypoints.generate.decisions.decide.prior_modes import AUTO
from vllm.entrypoints.generate.decisions.decide.read_context import sha256_of
from vllm.entrypoints.generate.decisions.decide.reading.read import QuestionRead
from vllm.entrypoints.generate.decisions.decide.temperature import (
    FIRST_PASS,
    FULL,
    Temperatures,
)
from vllm.entrypoints.generate.decisions.runtime.deployment_lock import run_id
from vllm.logger import init_logger

logger = init_logger(__name__)

MIN_ANSWERED = 50  # for the server-wide fit, and for a question type's own


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
    # A first pass at the range's top, kept by the keep rule, is served: on its questions the scores say
    # next to nothing, and answers near uniform say so until the full calibration decides on all of them
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
            lasting=True,
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

    scales = [
        map_scale(reads, temperatures, t, k) for t, k in zip(types, keys, strict=True)
    ]
    maps = await asyncio.to_thread(
        question_maps,
        [keys[i] for i in picked],
        [scores[i] for i in picked],
        [correct[i] for i in picked],
        [groups[i] for i in picked],
        [scales[i] for i in picked],
    )
    # Each question labelled twice or more (an operator's, not a calibration set's one-off), kept
    # with its answers so that a labels file's refit can pool with them.
    times = Counter(keys[i] for i in picked)
    labelled = [
        LabelledRead(
            state_sha256=sha256_of(answered[i][0].state),
            question=keys[i],
            scores=scores[i],
            scale=scales[i],
            correct=correct[i],
            group=groups[i],
        )
        for i in picked
        if times[keys[i]] > 1
    ]
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
    # And each question the file itself asks a precision of, on that question's labels.
    question_abstention = await asyncio.to_thread(
        question_thresholds,
        keys,
        scores,
        correct,
        groups,
        scales,
        maps.keys(),
        questions.precisions(),
    )
    return record.model_copy(
        update={
            "question_maps": maps,
            "abstention": abstention,
            "question_abstention": question_abstention,
            "labelled": labelled,
        }
    ).model_dump(mode="json")


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


def map_scale(
    reads: dict[str, bias.TypeReads], temperatures: Temperatures, kind: str, key: str
) -> float:
    """The scale a question's own map is pulled toward: 1 / the T its answers get without one (its
    own correction's where it has one, else its type's)."""
    own = reads[kind].questions.get(key) if kind in reads else None
    return 1.0 / (
        own.kept.temperature if own is not None else temperatures.for_type(kind).value
    )


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
    """How log lines name a question: its type and instructions (bias.question_key's first two)."""
    return "{}, {!r}".format(*json.loads(key)[:2])


def log(record: CalibrationRecord, loaded: bool, stage: str = FULL) -> None:
    for refused, line in log_lines(record, loaded, stage):
        (logger.warning if refused else logger.info)(line)


def failed(reason: str, warn: bool = True, lasting: bool = False) -> dict[str, Any]:
    """This run's failure, saved so the other API-server processes of this server don't measure again;
    the server applies T = 1.0 (default). A ``lasting`` one (the model's scores on this question set
    put T at the range's edge: no fault a restart mends) spares later runs too, until its file is
    deleted; any other (too few answers, which faults may cause) is measured again by a restart.
    ``warn``: say so (a first pass's failure is said where it is taken, since the full calibration
    follows)."""
    if warn:
        logger.warning("decision calibration failed, T=1.0 (default): %s", reason)
    return {"failed": reason, "run": run_id(), "lasting": lasting}
