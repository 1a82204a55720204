"""labels.py's in-context example rows: what a question's own labelled inputs shown ahead of the input
buy, measured split by split as the server measures them.

Examples change the reads themselves, so unlike the map rows these need the engine once per split:
per question, each drawn label is read again with examples from the other folds of the drawn labels
and the examples are measured against its plain read (calibration/examples.measure, the server's own
code, through its ShownReader), then each held-out line of the question is read with the examples the
server would serve (picked from all the drawn labels). The reads are cached by line and examples
(``shown_key``), so a rerun, or the offline figures, ask nothing twice.

Rows: ``labels -> examples + map`` serves a held-out line with its question's examples and their
map where the keep rule kept them, else as the map row does (its question's map where kept); this is
the issue's "both" row, and there is no row of examples without a map, since the server serves none:
examples always come with the map fitted on the reads with them. ``examples + map, always`` serves
every measured question with its examples and that map, no keep rule. Abstention for both rows is
fitted per type on the drawn labels served as the row would serve them from the other folds
(cross_validated_examples), from the reads ``measure`` asked anyway: no read more.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.quality.accuracy_figures import Reading, question_id
from tools.quality.labels_figures import (
    Item,
    Lines,
    answered_by_question,
    draw_labels,
    figures,
    fit_maps,
    fit_rules,
    fold_maps,
    labelled,
    served,
)
from vllm.entrypoints.generate.decisions.calibration.examples import (
    ShownReader,
    measure,
    measure_examples,
)
from vllm.entrypoints.generate.decisions.calibration.fitting import map_scale
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    QuestionExamples,
    QuestionMap,
    TypeReads,
    question_key,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    fold_of_groups,
)
from vllm.entrypoints.generate.decisions.calibration.question_map import MIN_LABELS
from vllm.entrypoints.generate.decisions.calibration.record import (
    CalibrationRecord,
)
from vllm.entrypoints.generate.decisions.decide.read_context import Example

EXAMPLES = "labels -> examples + map"
ALWAYS = "examples + map, always"


class NotRead(LookupError):
    """A read with examples the cache lacks, asked for where no engine is at hand."""


def shown_key(line: str, examples: Sequence[Example]) -> str:
    """A read's cache key: the line's (labels.line_key) and the examples shown with it, in order."""
    text = json.dumps(
        [line, [[e.state, e.answer] for e in examples]], ensure_ascii=False
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class CachedReader(ShownReader):
    """The server's ShownReader behind a cache of its reads (``store``, keyed by ``shown_key``);
    ``inner`` None: the cache alone (NotRead where it lacks a read)."""

    def __init__(
        self,
        store: dict[str, Any],
        inner: ShownReader | None,
        line_key: Any,
    ) -> None:
        self.store = store
        self.inner = inner
        self.line_key = line_key
        self.asked = 0

    async def scores(
        self,
        reads: dict[str, TypeReads],
        item: Item,
        examples: tuple[Example, ...],
    ) -> list[float] | None:
        key = shown_key(self.line_key(item), examples)
        if key not in self.store:
            if self.inner is None:
                raise NotRead(key)
            self.store[key] = {"scores": await self.inner.scores(reads, item, examples)}
            self.asked += 1
            if self.asked % 50 == 0:
                print(f"{self.asked} reads with examples", file=sys.stderr)
        return self.store[key]["scores"]


@dataclass
class SplitExamples:
    """One split's measured examples per question (None: a read with them was refused), each
    held-out line's reading with its question's served examples (under their map), each drawn
    label's scores as ``measure`` read them (with examples from the other folds, by label index) and
    the scale each measured question's maps are pulled toward."""

    measured: dict[str, QuestionExamples | None] = field(default_factory=dict)
    shown: dict[int, Reading] = field(default_factory=dict)
    labelled: dict[int, list[float]] = field(default_factory=dict)
    scales: dict[str, float] = field(default_factory=dict)


class Noting(ShownReader):
    """A ShownReader that notes the scores of every item it reads (by the item's identity)."""

    def __init__(self, inner: ShownReader) -> None:
        self.inner = inner
        self.noted: dict[int, list[float] | None] = {}

    async def scores(
        self,
        reads: dict[str, TypeReads],
        item: Item,
        examples: tuple[Example, ...],
    ) -> list[float] | None:
        scores = await self.inner.scores(reads, item, examples)
        self.noted[id(item)] = scores
        return scores


async def split_examples(
    labels: Lines,
    heldout: Lines,
    chosen: Sequence[int],
    count: int,
    reader: ShownReader,
    fits: CalibrationRecord,
    questions: set[str] | None = None,
) -> SplitExamples:
    """Per question (of ``questions``, else all) with at least MIN_LABELS answered drawn labels from
    two groups or more, as the server asks: its examples measured on the drawn labels' plain
    (corrected) scores, then every held-out line of it read with the served examples."""
    rows: dict[str, list[int]] = {}
    for i in chosen:
        if not labels.readings[i].error:
            rows.setdefault(question_id(labels.items[i]), []).append(i)
    out = SplitExamples()
    temperatures = fits.temperatures()

    async def one(question: str, indices: list[int]) -> None:
        key = question_key(labels.items[indices[0]].question)
        noting = Noting(reader)
        measured = await measure(
            key,
            [(labels.items[i], labels.readings[i].scores) for i in indices],
            count,
            noting,
            fits,
            temperatures,
        )
        out.measured[question] = measured
        if measured is None:
            return
        out.scales[question] = map_scale(
            fits.reads, temperatures, labels.items[indices[0]].question.qtype.name, key
        )
        for i in indices:
            scores = noting.noted.get(id(labels.items[i]))
            if scores is not None:
                out.labelled[i] = scores
        shown_map = measured.map
        asked = [
            h for h, item in enumerate(heldout.items) if question_id(item) == question
        ]
        reads = await asyncio.gather(
            *(
                reader.scores(fits.reads, heldout.items[h], measured.context())
                for h in asked
            )
        )
        for h, scores in zip(asked, reads, strict=True):
            out.shown[h] = (
                Reading([], error="refused with examples")
                if scores is None
                else Reading(shown_map.log_probabilities(scores), 1.0)
            )

    await asyncio.gather(
        *(
            one(question, indices)
            for question, indices in rows.items()
            if (questions is None or question in questions)
            and len(indices) >= MIN_LABELS
            and len({labels.items[i].group for i in indices}) > 1
        )
    )
    return out


def examples_readings(
    heldout: Lines,
    maps: dict[str, QuestionMap | None],
    split: SplitExamples,
    always: bool,
) -> list[Reading]:
    """The held-out lines as a row serves them: read with examples where its question's were kept
    (``always``: measured), else as the map row serves them."""
    out = []
    for h, (item, reading) in enumerate(
        zip(heldout.items, heldout.readings, strict=True)
    ):
        measured = split.measured.get(question_id(item))
        use = measured is not None and (always or measured.kept)
        out.append(
            split.shown[h] if use else served(reading, maps.get(question_id(item)))
        )
    return out


def cross_validated_examples(
    labels: Lines,
    chosen: Sequence[int],
    split: SplitExamples,
    always: bool,
    folds: int = FOLDS,
) -> Lines:
    """The chosen labelled lines (answered ones), each served as the row would serve it from the other
    folds of its question's labels alone (groups within a fold, the folds ``measure`` read them over):
    for a measured question, its examples measured again on the other folds' reads with and without
    examples; where kept (``always``: measured), the line's read with examples from the other folds
    under the map fitted on the other folds' reads with examples; else the line as the map row's
    cross-validation serves it (labels_figures.cross_validated). What abstention may be fitted on,
    with no new read. One leak: another fold's label was read with this label among its examples."""
    out = Lines([], [])
    for question, rows in answered_by_question(labels, chosen).items():
        fold = fold_of_groups([labels.items[i].group for i in rows], folds)
        measured = question in split.scales and all(i in split.labelled for i in rows)
        for f in sorted(set(fold)):
            training = [i for i, g in zip(rows, fold, strict=True) if g != f]
            tested = [i for i, g in zip(rows, fold, strict=True) if g == f]
            shown = (
                measure_examples(
                    [],
                    labelled(labels, training),
                    [split.labelled[i] for i in training],
                    split.scales[question],
                )
                if measured and len({labels.items[i].group for i in training}) > 1
                else None
            )
            use = shown is not None and (always or shown.kept)
            maps = {} if use else fold_maps(labels, rows, training, folds)
            for i in tested:
                out.items.append(labels.items[i])
                out.readings.append(
                    Reading(shown.map.log_probabilities(split.labelled[i]), 1.0)
                    if use and shown is not None
                    else served(labels.readings[i], maps.get(question))
                )
    return out


def as_maps(split: SplitExamples, always: bool) -> dict[str, QuestionMap | None]:
    """The split's examples as figures() counts maps: one per measured question, kept or not."""
    return {
        q: (m.map if m is not None and (always or m.kept) else None)
        for q, m in split.measured.items()
    }


async def plain_drift(
    labels: Lines, reader: ShownReader, fits: CalibrationRecord, per_type: int = 2
) -> float:
    """The largest score difference between the cached plain reads and the same lines read now with
    no examples (the first ``per_type`` answered labels of each type): a check that the reads with
    examples are compared with reads the engine would still give."""
    picked: dict[str, list[int]] = {}
    for i, (item, reading) in enumerate(
        zip(labels.items, labels.readings, strict=True)
    ):
        kind = picked.setdefault(item.question.qtype.name, [])
        if not reading.error and len(kind) < per_type:
            kind.append(i)
    indices = [i for kind in picked.values() for i in kind]
    now = await asyncio.gather(
        *(reader.scores(fits.reads, labels.items[i], ()) for i in indices)
    )
    return max(
        max(abs(a - b) for a, b in zip(scores, labels.readings[i].scores, strict=True))
        for i, scores in zip(indices, now, strict=True)
        if scores is not None
    )


def choose_questions(items: Sequence[Item], limit: int | None) -> set[str] | None:
    """The first ``limit`` questions of the held-out file taken in turn from each type (None: all):
    a cheaper measurement that still covers every type."""
    if limit is None:
        return None
    by_type: dict[str, list[str]] = {}
    for item in items:
        queue = by_type.setdefault(item.question.qtype.name, [])
        if question_id(item) not in queue:
            queue.append(question_id(item))
    chosen: list[str] = []
    while len(chosen) < limit and any(by_type.values()):
        for queue in by_type.values():
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return set(chosen)


async def examples_rows(
    labels: Lines,
    heldout: Lines,
    splits: int,
    per_question: int,
    count: int,
    reader: ShownReader,
    fits: CalibrationRecord,
    seed: int = 0,
    questions: set[str] | None = None,
    precision: float | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Both example rows' figures per split (the splits labels_figures.evaluate draws); with
    ``precision``, abstention fitted per type on the drawn labels as the row serves them
    cross-validated (cross_validated_examples), as the map row's is."""
    rows: dict[str, list[dict[str, Any]]] = {EXAMPLES: [], ALWAYS: []}
    for split in range(splits):
        chosen = draw_labels(labels.items, per_question, f"{seed}-{split}")
        measured = await split_examples(
            labels, heldout, chosen, count, reader, fits, questions
        )
        maps = fit_maps(labels, chosen)
        for name, always in ((EXAMPLES, False), (ALWAYS, True)):
            rules = None
            if precision is not None:
                validated = cross_validated_examples(labels, chosen, measured, always)
                rules = fit_rules(validated.items, validated.readings, precision)
            rows[name].append(
                figures(
                    heldout,
                    examples_readings(heldout, maps, measured, always),
                    seed,
                    rules=rules,
                    maps=as_maps(measured, always),
                )
            )
    return rows


@contextlib.asynccontextmanager
async def engine_reader(model: str, dtype: str) -> AsyncIterator[ShownReader]:
    """The server's ShownReader over an in-process engine started as the tools' servers are (their
    engine arguments) and the decision service over it with calibration off: the saved record's reads
    choose each type's layout and correction, as they did for the cached plain reads."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.generate.decisions.bulk import Decisions
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ["VLLM_TYPED_DECISIONS_CALIBRATION"] = "off"
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=model,
            dtype=dtype,
            max_model_len=8192,
            enable_prefix_caching=True,
            enforce_eager=True,
            block_size=32,
        )
    )
    try:
        decisions = await Decisions.start(engine, served_model="m")
        service = decisions.service.base
        backend = service.backend
        print(
            f"engine: render version {backend.render_version}, "
            f"debias {service.settings.debias}",
            file=sys.stderr,
        )
        yield ShownReader(backend, service.settings.debias, service.settings.prior)
    finally:
        engine.shutdown()
