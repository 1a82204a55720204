# SPDX-License-Identifier: Apache-2.0
"""Reading the calibration question set inside the server: each question in each label layout, as
requests read it, a few at a time, a first pass's reads reused by the full one; and the log line that
says what a pass reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.calibration import question_file
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prior_modes import uses_content_free
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
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
    ESTIMATE_AFTER,
    Readiness,
)
from vllm.entrypoints.generate.decisions.decide.settings import NO_DEBIAS, Debias
from vllm.logger import init_logger

logger = init_logger(__name__)

CONCURRENCY = 8
# A first pass reads about this many questions (a share of each type), in the first layout only: 104
# reads of the bundled set, where half of it in both layouts (414) kept a 1.5B model's first answer
# 343 s after /health on two cores.
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
    only: Collection[int] | None = None,
) -> list[Row]:
    """Each question's reading in each layout, read as requests are (``debias``, the backend's options
    in that layout; with ``correction``'s content-free reads when it asks for them), ``CONCURRENCY``
    questions at a time. A question's layouts are read one after the other, so the later ones find the
    prompt they share with the first (template, state, criterion) in the engine's prefix cache.

    ``only``: the questions (by index) to read, the others left unread (None). ``earlier``: the first
    pass's readings by question and layout; each is taken as it is (given its content-free reads where
    ``correction`` asks for them), and one that failed is not read again. Each read that goes to the
    engine, answered or not, advances ``progress``."""
    gate = asyncio.Semaphore(CONCURRENCY)
    reused: Earlier = earlier or {}
    options = {
        layout: backend.with_layout(backend.options, layout) for layout in layouts
    }
    content_free = uses_content_free(correction.mode)
    before: Row = [None] * len(layouts)

    async def read_item(
        index: int, item: question_file.LabelledQuestion, column: int
    ) -> QuestionRead | None:
        layout = layouts[column]
        was_read = (index, column) in reused
        kept = reused.get((index, column))
        if was_read and (kept is None or not content_free):
            return kept
        try:
            context = ReadContext.about(
                item.state, request_id(index, layout, layouts), options[layout]
            )
            plan = plan_read(backend, item.question, context, debias, correction)
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
            return list(before)
        async with gate:
            return [
                await read_item(index, item, column) for column in range(len(layouts))
            ]

    return list(
        await asyncio.gather(*(one(i, q) for i, q in enumerate(questions.questions)))
    )


def first_pass_stride(questions: int) -> int:
    """A first pass reads one question in this many of each type: about ``FIRST_PASS_QUESTIONS``, or
    all of a smaller file (a fit needs at least fitting.MIN_ANSWERED)."""
    return max(1, questions // FIRST_PASS_QUESTIONS)


def first_pass_questions(questions: question_file.QuestionFile) -> list[int]:
    """The questions a first pass reads: one in :func:`first_pass_stride` of each type, in file order
    (each type's share kept)."""
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


def request_id(index: int, layout: str | None, layouts: tuple[str | None, ...]) -> str:
    """The engine's name for a calibration read: the question's index, and its layout where several are read."""
    return f"decision-calibration-{index}" + (
        f"-{layout}" if len(layouts) > 1 and layout is not None else ""
    )


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
