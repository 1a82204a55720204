"""labels.py's in-context example rows on a fake reader (no engine): the reads cache keys the examples
shown, a label is never shown itself and a held-out line never itself, and a question whose examples
are not kept is served as the map row serves it."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.unit.test_labels_benchmark import LEANING, line
from tools.quality.accuracy_figures import Reading
from tools.quality.labels import line_key
from tools.quality.labels_examples import (
    CachedReader,
    NotRead,
    examples_readings,
    shown_key,
    split_examples,
)
from tools.quality.labels_figures import Lines, fit_maps, served
from vllm.entrypoints.generate.decisions.decide.calibration.results import (
    CalibrationRecord,
    QuestionsUsed,
)
from vllm.entrypoints.generate.decisions.decide.read_context import Example
from vllm.entrypoints.generate.decisions.runtime.examples_pass import ShownReader

FITS = CalibrationRecord(
    applied_temperature=1.0,
    by_type={},
    reads={},
    questions=QuestionsUsed(file="none", total=0, used=0, skipped=[]),
    seconds=0.0,
    date="",
    vllm_version="",
)


class FakeReader(ShownReader):
    """Scores that lean toward the answer shown most among the examples; every read noted."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Example, ...]]] = []

    async def scores(self, reads, item, examples):
        self.seen.append((item.state, examples))
        yes = sum(e.answer == "yes" for e in examples)
        rest = [0.0] * (len(item.question.options) - 1)
        return [0.1 * yes + random.Random(item.state).gauss(0, 1), *rest]


def lines(prefix: str, count: int) -> Lines:
    rng = random.Random(prefix)
    out = Lines([], [])
    for i in range(count):
        out.items.append(line(LEANING, rng.choice(["yes", "no"]), f"{prefix}{i}"))
        out.readings.append(Reading([rng.gauss(0, 1), 0.0], 1.0))
    return out


def test_the_cache_key_names_the_examples_shown():
    one = (Example("a", "yes"), Example("b", "no"))
    assert shown_key("line", one) == shown_key("line", tuple(one))
    assert shown_key("line", one) != shown_key("line", one[::-1])
    assert shown_key("line", one) != shown_key("line", one[:1])
    assert shown_key("line", one) != shown_key("line", ())
    assert shown_key("line", one) != shown_key("other", one)


def test_the_cache_asks_each_read_once_and_refuses_without_an_engine():
    labels = lines("l", 2)
    fake = FakeReader()
    store: dict = {}
    cached = CachedReader(store, fake, line_key)
    shown = (Example("a", "yes"),)
    first = asyncio.run(cached.scores({}, labels.items[0], shown))
    again = asyncio.run(cached.scores({}, labels.items[0], shown))
    assert first == again and len(fake.seen) == 1 and cached.asked == 1
    offline = CachedReader(store, None, line_key)
    assert asyncio.run(offline.scores({}, labels.items[0], shown)) == first
    with pytest.raises(NotRead):
        asyncio.run(offline.scores({}, labels.items[1], shown))


def test_no_line_is_read_with_itself_among_its_examples():
    labels, heldout = lines("l", 30), lines("h", 10)
    fake = FakeReader()
    chosen = list(range(20))
    split = asyncio.run(split_examples(labels, heldout, chosen, 4, fake, FITS))
    measured = split.measured[next(iter(split.measured))]
    assert measured is not None and len(measured.examples) == 4
    drawn = {labels.items[i].state for i in chosen}
    # every drawn label read once with examples from other folds, every held-out line once
    assert len(fake.seen) == len(chosen) + len(heldout.items)
    for state, examples in fake.seen:
        assert examples and state not in {e.state for e in examples}
        assert {e.state for e in examples} <= drawn
    assert set(split.shown) == set(range(len(heldout.items)))
    # a question whose examples are not kept is served as the map row serves it
    maps = fit_maps(labels, chosen)
    readings = examples_readings(heldout, maps, split, always=False)
    always = examples_readings(heldout, maps, split, always=True)
    for h, reading in enumerate(heldout.readings):
        question = next(iter(maps))
        expected = split.shown[h] if measured.kept else served(reading, maps[question])
        assert readings[h] == expected
        assert always[h] == split.shown[h]
