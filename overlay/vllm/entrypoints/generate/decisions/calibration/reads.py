# SPDX-License-Identifier: Apache-2.0
"""Reading the calibration question set inside the server, as requests read it."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import (
    NO_CORRECTION,
    Correction,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import (
    QuestionRead,
    Resolved,
    plan_read,
    with_content_free,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import read as run_plan
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    ESTIMATE_AFTER,
    Readiness,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    NO_DEBIAS,
    Debias,
    uses_content_free,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

# Reads in flight at once; one while decisions are answered (a full calibration behind a first pass,
# the examples pass, live labels), as the engine prefills all that wait in one step, each request too.
CONCURRENCY = 8
WHILE_ANSWERING = 1
# A first pass reads about this many questions (a share of each type), in the first layout only: 104
# of the bundled set (414, half of it in both layouts, kept a 1.5B model's answers 343 s away).
FIRST_PASS_QUESTIONS = 100


Row = list[QuestionRead | None]  # a question's readings, one per layout (None: failed)
# The first pass's readings by (question, layout column), reused by the full pass (None: failed)
Earlier = dict[tuple[int, int], QuestionRead | None]


async def read_all(
    backend: DecisionBackend,
    questions: question_file.QuestionFile,
    debias: Debias = NO_DEBIAS,
    correction: Correction = NO_CORRECTION,
    layouts: tuple[str | None, ...] = (None,),
    progress: Readiness | None = None,
    earlier: Earlier | None = None,
    concurrency: int = CONCURRENCY,
    only: Collection[int] | None = None,
) -> list[Row]:
    """Each question's reading in each layout, a question's layouts one after the other so the later
    find their shared prefix in the engine's cache; ``earlier``: a first pass's, reused."""
    gate = asyncio.Semaphore(concurrency)
    reused: Earlier = earlier or {}
    options = {
        layout: backend.with_layout(backend.options, layout) for layout in layouts
    }
    content_free = uses_content_free(correction.mode)

    async def read_item(
        index: int, item: question_file.LabelledQuestion, column: int
    ) -> QuestionRead | None:
        layout = layouts[column]
        kept = reused.get((index, column))
        if (index, column) in reused and (kept is None or not content_free):
            return kept
        # The engine's name for the read names its layout only where several are read.
        named = f"-{layout}" if len(layouts) > 1 and layout is not None else ""
        try:
            context = ReadContext.about(
                item.state, f"decision-calibration-{index}{named}", options[layout]
            )
            plan = plan_read(
                backend, item.question, context, debias, Resolved(correction)
            )
            if kept is not None:
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
            return [None] * len(layouts)
        async with gate:
            return [
                await read_item(index, item, column) for column in range(len(layouts))
            ]

    return list(
        await asyncio.gather(*(one(i, q) for i, q in enumerate(questions.questions)))
    )


def first_pass_stride(questions: int) -> int:
    """A first pass reads one question in this many of each type."""
    return max(1, questions // FIRST_PASS_QUESTIONS)


def first_pass_questions(questions: question_file.QuestionFile) -> list[int]:
    """The questions a first pass reads, each type's share kept."""
    stride = first_pass_stride(len(questions.questions))
    seen: dict[str, int] = {}
    chosen = []
    for index, item in enumerate(questions.questions):
        name = item.question.qtype.name
        if seen.setdefault(name, 0) % stride == 0:
            chosen.append(index)
        seen[name] += 1
    return chosen


def to_read(
    questions: int,
    layouts: tuple[str | None, ...],
    earlier: Earlier,
    content_free: bool,
) -> int:
    """How many reads :func:`read_all` sends to the engine, given the first pass's ``earlier``."""
    again = sum(read is not None for read in earlier.values()) if content_free else 0
    return questions * len(layouts) - len(earlier) + again


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


def announce(
    questions: question_file.QuestionFile,
    layouts: tuple[str | None, ...],
    progress: Readiness | None,
    first_pass: int | None = None,
    content_free: bool = False,
    reads: int | None = None,
) -> None:
    """The line that says what a calibration pass reads."""
    count = len(questions.questions) if first_pass is None else first_pass
    named = [layout for layout in layouts if layout is not None]
    everything = count * len(layouts)
    how = f"{count} questions in {len(named)} label layouts ({', '.join(named)}), {everything} reads in all"
    if len(named) == 1:
        how = f"{count} questions in {named[0]} labels"
    elif not named:
        how = f"{everything} questions"
    units = "reads"
    if first_pass is not None:
        stride = first_pass_stride(len(questions.questions))
        which = "every question" if stride == 1 else f"one in {stride} of each type"
        how = (
            f"a first pass: {how}"
            f"{'' if content_free else ' without content-free reads'} ({which}; answers "
            "start when it is fitted)"
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
