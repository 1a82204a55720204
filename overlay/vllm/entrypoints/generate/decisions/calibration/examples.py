# SPDX-License-Identifier: Apache-2.0
"""In-context examples, the full calibration's last step. They may help a small model or pull every
answer toward their labels, so they are measured as maps are: a map fitted on reads with them against
one on reads without (so the gain is the examples', not a map's). The inputs of one fold share their
examples, so their prompts share a cached prefix."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.calibration.abstention import (
    held_out_threshold,
)
from vllm.entrypoints.generate.decisions.calibration.fitting import (
    as_chosen,
    corrected_scores,
    map_scale,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    Calibrated,
    QuestionExamples,
    ShownExample,
    TypeReads,
    question_key,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    Labelled,
    fold_of_groups,
)
from vllm.entrypoints.generate.decisions.calibration.question_map import (
    MIN_LABELS,
    compared,
    fit_map,
    held_out,
)
from vllm.entrypoints.generate.decisions.calibration.reads import CONCURRENCY
from vllm.entrypoints.generate.decisions.calibration.record import CalibrationRecord
from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.read_context import Example, ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.corrections import (
    Asked,
    Corrections,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import plan_read, read
from vllm.entrypoints.generate.decisions.decide.settings import Debias, PriorSetting
from vllm.entrypoints.generate.decisions.decide.temperature import DEFAULT, Temperatures
from vllm.logger import init_logger

logger = init_logger(__name__)

# An input longer than this is not shown as an example: examples sit in every prompt of their
# question, and a long one would crowd out the input itself.
MAX_EXAMPLE_CHARS = 1500


def pick_examples(
    states: Sequence[str], answers: Sequence[str], count: int
) -> list[int]:
    """Which labelled inputs to show: the answers in turn, none twice before every one once."""
    queues: dict[str, list[int]] = {}
    for index, (state, answer) in enumerate(zip(states, answers, strict=True)):
        if len(state) <= MAX_EXAMPLE_CHARS:
            queues.setdefault(answer, []).append(index)
    picked: list[int] = []
    while len(picked) < count and any(queues.values()):
        for queue in queues.values():
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def measure_examples(
    examples: Sequence[ShownExample],
    plain: Labelled,
    shown: Sequence[Sequence[float]],
    scale: float,
    precision: float | None = None,
) -> QuestionExamples:
    """``examples`` measured: ``shown``, ``plain``'s labels read with examples from the other folds."""
    read_with = dataclasses.replace(plain, scores=shown)
    base, _ = held_out(plain, scale)
    with_examples, _ = held_out(read_with, scale)
    fitted_scale, fitted_bias = fit_map(shown, plain.correct, scale)
    return QuestionExamples(
        examples=list(examples),
        scale=fitted_scale,
        bias=fitted_bias,
        abstention=(
            held_out_threshold(with_examples, read_with, precision)
            if precision is not None
            else None
        ),
        **compared(with_examples, base, plain).model_dump(),
    )


# Content-free reads kept: one per question, layout and set of examples.
PRIOR_CACHE_SIZE = 1024


class ShownReader:
    """Reads with examples as requests read (content-free reads cached apart, keyed with them)."""

    def __init__(
        self,
        backend: DecisionBackend,
        debias: Debias,
        prior: PriorSetting,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.backend = backend
        self.asked = Asked(debias)
        self.corrections = Corrections(prior, PRIOR_CACHE_SIZE)
        self.gate = asyncio.Semaphore(concurrency)
        self.numbers = itertools.count()

    async def scores(
        self,
        reads: dict[str, TypeReads],
        item: question_file.LabelledQuestion,
        examples: tuple[Example, ...],
    ) -> list[float] | None:
        """``item``'s corrected scores read with ``examples`` (None: refused)."""
        context = ReadContext.about(
            item.state,
            f"decision-calibration-examples-{next(self.numbers)}",
            self.backend.options,
        ).with_examples(examples)
        async with self.gate:
            try:
                how = Calibrated(Temperatures(DEFAULT), reads=reads).resolve(
                    item.question, self.asked, self.corrections
                )
                plan = plan_read(
                    self.backend, item.question, context, self.asked.debias, how
                )
                return (await read(plan)).scores
            except DecisionError as exc:
                logger.debug(
                    "calibration question %s with examples skipped: %s",
                    item.id,
                    exc.message,
                )
                return None


async def with_examples(
    record: CalibrationRecord,
    by_layout: dict[str | None, list[Any]],
    count: int,
    reader: ShownReader,
) -> CalibrationRecord:
    """``record`` with the examples of each question with MIN_LABELS labels (two groups) measured."""
    temperatures = record.temperatures()
    labelled: dict[str, list[tuple[question_file.LabelledQuestion, list[float]]]] = {}
    for item, done in as_chosen(by_layout, record.reads):
        labelled.setdefault(question_key(item.question), []).append(
            (item, corrected_scores(item, done, record.reads))
        )
    asked = {
        key: rows
        for key, rows in labelled.items()
        if len(rows) >= MIN_LABELS and len({item.group for item, _ in rows}) > 1
    }
    if not asked:
        return record
    logger.info(
        "decision calibration: reading %d labelled inputs of %d questions again with up to %d "
        "in-context examples each",
        sum(len(rows) for rows in asked.values()),
        len(asked),
        count,
    )
    try:
        measured = await gather_or_cancel(
            [
                measure(key, rows, count, reader, record, temperatures)
                for key, rows in asked.items()
            ]
        )
    except Exception:
        # The calibration is fitted already: a fault here costs the examples, not the calibration.
        logger.exception("decision calibration: in-context examples not measured")
        return record
    examples = {key: m for key, m in zip(asked, measured, strict=True) if m}
    return record.model_copy(update={"question_examples": examples})


async def measure(
    key: str,
    rows: Sequence[tuple[question_file.LabelledQuestion, list[float]]],
    count: int,
    reader: ShownReader,
    fits: CalibrationRecord,
    temperatures: Temperatures,
) -> QuestionExamples | None:
    """One question's examples measured (None: a read with them was refused)."""
    items = [item for item, _ in rows]
    answers = [item.question.options[item.correct].key for item in items]
    groups = [item.group for item in items]
    fold = fold_of_groups(groups, FOLDS)

    def picked(among: list[int]) -> tuple[Example, ...]:
        chosen = pick_examples(
            [items[j].state for j in among], [answers[j] for j in among], count
        )
        return tuple(Example(items[among[c]].state, answers[among[c]]) for c in chosen)

    shown = await asyncio.gather(
        *(
            reader.scores(
                fits.reads,
                item,
                picked([j for j in range(len(items)) if fold[j] != fold[i]]),
            )
            for i, item in enumerate(items)
        )
    )
    read_with = [scores for scores in shown if scores is not None]
    if len(read_with) < len(shown):
        return None
    served = picked(list(range(len(items))))
    return await asyncio.to_thread(
        measure_examples,
        [ShownExample(state=e.state, answer=e.answer) for e in served],
        Labelled([scores for _, scores in rows], [i.correct for i in items], groups),
        read_with,
        map_scale(fits.reads, temperatures, items[0].question.qtype.name, key),
        next((i.precision for i in items if i.precision is not None), None),
    )
