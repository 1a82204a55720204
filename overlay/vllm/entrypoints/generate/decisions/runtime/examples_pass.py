# SPDX-License-Identifier: Apache-2.0
"""The full calibration's last step: each question the operator labelled often enough, read again
with in-context examples, and the examples measured against its answers without them
(calibration/examples.py).

Each labelled input is read with up to VLLM_TYPED_DECISIONS_EXAMPLES examples picked from the labels
in the other folds of its question (the folds its own map is cross-validated over), in the layout and
under the correction its type reads with, so the held-out figures compare like with like. The inputs
of one fold share their examples, so their prompts share a prefix in the engine's cache.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.calibration import question_file
from vllm.entrypoints.generate.decisions.decide.calibration.bias import (
    TypeReads,
    question_key,
)
from vllm.entrypoints.generate.decisions.decide.calibration.examples import (
    QuestionExamples,
    ShownExample,
    measure_examples,
    pick_examples,
)
from vllm.entrypoints.generate.decisions.decide.calibration.maths import (
    FOLDS,
    fold_of_groups,
)
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    MIN_LABELS,
)
from vllm.entrypoints.generate.decisions.decide.calibration.results import (
    CalibrationRecord,
)
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prior_modes import PriorSetting
from vllm.entrypoints.generate.decisions.decide.read_context import (
    Example,
    ReadContext,
)
from vllm.entrypoints.generate.decisions.decide.reading.corrections import (
    Asked,
    Corrections,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import (
    plan_read,
    read,
)
from vllm.entrypoints.generate.decisions.decide.settings import Debias
from vllm.entrypoints.generate.decisions.decide.temperature import (
    DEFAULT,
    Temperatures,
)
from vllm.entrypoints.generate.decisions.runtime.fitting import (
    chosen_layout,
    corrected_scores,
    map_scale,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

CONCURRENCY = 8  # reads in flight at once, as the calibration's own
PRIOR_CACHE_SIZE = (
    1024  # content-free reads kept: one per question, layout and set of examples
)


class ShownReader:
    """Reads a labelled question with examples as a request for it is read: the layout and correction
    Corrections.resolve gives it under the calibration's choices (its content-free reads through a
    cache of its own, keyed with the examples)."""

    def __init__(
        self, backend: DecisionBackend, debias: Debias, prior: PriorSetting
    ) -> None:
        self.backend = backend
        self.asked = Asked(debias)
        self.corrections = Corrections(prior, PRIOR_CACHE_SIZE)
        self.gate = asyncio.Semaphore(CONCURRENCY)
        self.numbers = itertools.count()

    async def scores(
        self,
        reads: dict[str, TypeReads],
        item: question_file.LabelledQuestion,
        examples: tuple[Example, ...],
    ) -> list[float] | None:
        """``item`` read with ``examples``: its corrected scores (None: the read was refused)."""
        context = ReadContext.about(
            item.state,
            f"decision-calibration-examples-{next(self.numbers)}",
            self.backend.options,
        ).with_examples(examples)
        async with self.gate:
            try:
                how = self.corrections.resolve(
                    item.question,
                    self.asked,
                    Temperatures(DEFAULT),
                    None,
                    chosen_reads=reads,
                )
                plan = plan_read(
                    self.backend,
                    item.question,
                    context,
                    self.asked.debias,
                    how.correction,
                    how.layout,
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
    record: dict[str, Any],
    by_layout: dict[str | None, list[Any]],
    layouts: tuple[str | None, ...],
    count: int,
    reader: ShownReader,
) -> dict[str, Any]:
    """``record`` (a fitted calibration) with its labelled questions' examples measured: every
    question with at least MIN_LABELS labels from two groups or more."""
    fits = CalibrationRecord.model_validate(record)
    temperatures = fits.temperatures()
    labelled: dict[str, list[tuple[question_file.LabelledQuestion, list[float]]]] = {}
    for layout, pairs in by_layout.items():
        for item, done in pairs:
            if layout == chosen_layout(
                fits.reads, item.question.qtype.name, layouts[0]
            ):
                labelled.setdefault(question_key(item.question), []).append(
                    (item, corrected_scores(item, done, fits.reads))
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
                measure(key, rows, count, reader, fits, temperatures)
                for key, rows in asked.items()
            ]
        )
    except Exception:
        # The calibration is fitted already: a fault here costs the examples, not the calibration.
        logger.exception("decision calibration: in-context examples not measured")
        return record
    examples = {
        key: m.model_dump(mode="json")
        for key, m in zip(asked, measured, strict=True)
        if m
    }
    return {**record, "question_examples": examples}


async def measure(
    key: str,
    rows: Sequence[tuple[question_file.LabelledQuestion, list[float]]],
    count: int,
    reader: ShownReader,
    fits: CalibrationRecord,
    temperatures: Any,
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
    kind = items[0].question.qtype.name
    return await asyncio.to_thread(
        measure_examples,
        [ShownExample(state=e.state, answer=e.answer) for e in served],
        [scores for _, scores in rows],
        read_with,
        [item.correct for item in items],
        groups,
        map_scale(fits.reads, temperatures, kind, key),
        next((i.precision for i in items if i.precision is not None), None),
    )
