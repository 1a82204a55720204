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
    ALWAYS,
    EXAMPLES,
    CachedReader,
    NotRead,
    SplitExamples,
    cross_validated_examples,
    examples_readings,
    examples_rows,
    shown_key,
    split_examples,
)
from tools.quality.labels_figures import Lines, cross_validated, fit_maps, served
from vllm.entrypoints.generate.decisions.calibration.examples import ShownReader
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    fold_of_groups,
)
from vllm.entrypoints.generate.decisions.calibration.question_map import (
    fit_map,
)
from vllm.entrypoints.generate.decisions.calibration.record import (
    CalibrationRecord,
    QuestionsUsed,
)
from vllm.entrypoints.generate.decisions.decide.read_context import Example

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


def test_labels_are_served_from_the_other_folds_for_abstention():
    labels, heldout = lines("l", 30), lines("h", 10)
    chosen = list(range(20))
    split = asyncio.run(split_examples(labels, heldout, chosen, 4, FakeReader(), FITS))
    # every drawn label was read with examples from the other folds, as measure read it
    assert set(split.labelled) == set(chosen)
    (question,) = split.scales
    always = cross_validated_examples(labels, chosen, split, always=True)
    assert sorted(item.state for item in always.items) == sorted(
        labels.items[i].state for i in chosen
    )
    # served with examples, under the map fitted on the other folds' reads with examples only
    fold = fold_of_groups([labels.items[i].group for i in chosen], FOLDS)
    by_state = dict(zip((i.state for i in always.items), always.readings, strict=True))
    for i, f in zip(chosen, fold, strict=True):
        training = [j for j, g in zip(chosen, fold, strict=True) if g != f]
        scale, bias = fit_map(
            [split.labelled[j] for j in training],
            [labels.items[j].correct for j in training],
            split.scales[question],
        )
        own = [scale * s + b for s, b in zip(split.labelled[i], bias, strict=True)]
        got = by_state[labels.items[i].state].scores
        # log-probabilities of the same map: equal up to the normalising constant
        assert [g - got[0] for g in got] == pytest.approx([o - own[0] for o in own])
    # a question with no measured examples is served as the map row's cross-validation serves it
    plain = cross_validated_examples(labels, chosen, SplitExamples(), always=True)
    expected = cross_validated(labels, chosen)
    assert plain.readings == expected.readings
    assert [i.state for i in plain.items] == [i.state for i in expected.items]


def test_example_rows_carry_abstention_figures_when_asked():
    labels, heldout = lines("l", 30), lines("h", 10)
    rows = asyncio.run(
        examples_rows(labels, heldout, 1, 20, 4, FakeReader(), FITS, precision=0.8)
    )
    for name in (EXAMPLES, ALWAYS):
        entry = rows[name][0]["types"]["noul"]
        assert "abstention_rate" in entry and "precision_reached" in entry
    bare = asyncio.run(examples_rows(labels, heldout, 1, 20, 4, FakeReader(), FITS))
    assert "abstention_rate" not in bare[EXAMPLES][0]["types"]["noul"]
