"""The offline part of tools/quality/labels.py on synthetic reads (no server): splits drawn by group
and seeded, a question whose labels carry a lean getting a kept map that raises its held-out
accuracy, collapsed and one-answer questions counted, the majority baseline, abstention figures."""

from __future__ import annotations

import json
import math
import random

import pytest

from tools.quality.accuracy_figures import Reading, ece_floor, metrics, question_id
from tools.quality.labels import line_key, load_reads, missing
from tools.quality.labels_figures import (
    LETTERS,
    LETTERS_MAP,
    NO_LABELS,
    QUESTION_MAP,
    TYPE_T,
    TYPE_T_MAP,
    Lines,
    abstention_figures,
    cross_validated,
    draw_labels,
    evaluate,
    fit_maps,
    fitted_temperatures,
    majority,
    one_answer,
    with_maps,
)
from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.calibration.in_force import Abstention

LEANING = {"type": "noul", "instructions": "Is it urgent?"}
PLAIN = {"type": "noul", "instructions": "Is it about billing?"}


def line(question: dict, expected: str, group: str, state: str | None = None):
    record = {
        "state": state or f"input {group}",
        "question": question,
        "expected": expected,
        "group": group,
        "id": f"{group}-{question['instructions']}",
    }
    return question_file.parse_line(1, json.dumps(record))


def leaning_lines(prefix: str, count: int, seed: int) -> Lines:
    """A yes/no question the model reads with a lean: the answer is yes when a hidden x > 0 (|x| < 2),
    and the scores are (x + 2, 0), so softmax always says yes while labels show the lean of 2 nats."""
    rng = random.Random(seed)
    out = Lines([], [])
    for i in range(count):
        x = min(max(rng.gauss(0.0, 1.0), -1.9), 1.9)
        out.items.append(line(LEANING, "yes" if x > 0 else "no", f"{prefix}{i}"))
        out.readings.append(Reading([x + 2.0, 0.0], 1.0))
    return out


def test_draws_whole_groups_per_question_seeded():
    items = [
        line(q, "yes", f"g{i}", state=f"input {i} {part}")
        for i in range(10)
        for q in (LEANING, PLAIN)
        for part in ("a", "b")
    ]
    drawn = draw_labels(items, 3, "0-0")
    assert drawn == draw_labels(items, 3, "0-0")
    assert drawn != draw_labels(items, 3, "0-1")
    for question in (LEANING, PLAIN):
        rows = [
            i for i in drawn if items[i].raw["instructions"] == question["instructions"]
        ]
        groups = {items[i].group for i in rows}
        # three groups of this question, each with both its lines
        assert len(groups) == 3 and len(rows) == 6
    # a question's draw stays when another question's labels are left out
    leaning = [i for i, item in enumerate(items) if item.raw == LEANING]
    alone = draw_labels([items[i] for i in leaning], 3, "0-0")
    assert [leaning[i] for i in alone] == [i for i in drawn if items[i].raw == LEANING]
    # more than there are: every line
    assert draw_labels(items, 50, "0-0") == list(range(len(items)))


def test_a_leaning_question_gets_a_kept_map_that_raises_heldout_accuracy():
    labels = leaning_lines("L", 30, seed=0)
    heldout = leaning_lines("H", 200, seed=2)
    maps = fit_maps(labels, range(20))
    kept = maps[question_id(labels.items[0])]
    assert kept is not None and kept.bias[0] < kept.bias[1]
    before = metrics(heldout.items, heldout.readings, 0)
    after = metrics(heldout.items, with_maps(heldout, maps), 0)
    assert before["accuracy"] < 0.6
    assert one_answer(heldout.items, heldout.readings) == 1
    assert after["accuracy"] > before["accuracy"] + 0.2
    assert after["log_loss"] < before["log_loss"]
    assert one_answer(heldout.items, with_maps(heldout, maps)) == 0
    results = evaluate(labels, heldout, splits=3, per_question=20, precision=0.8)
    rows = results["rows"]
    accuracy = {row: rows[row]["types"]["noul"]["accuracy"] for row in rows}
    assert accuracy[QUESTION_MAP]["mean"] > accuracy[NO_LABELS]["mean"] + 0.15
    assert accuracy[NO_LABELS]["sd"] == 0.0  # no labels: the same in every split
    assert accuracy[QUESTION_MAP]["sd"] > 0.0  # the splits drew different labels
    assert rows[QUESTION_MAP]["types"]["noul"]["maps_kept"]["mean"] >= 2 / 3
    assert rows[NO_LABELS]["types"]["noul"]["one_answer"]["mean"] == 1.0
    assert results["labels_drawn"]["mean"] == 20
    assert rows[QUESTION_MAP]["types"]["noul"]["labelled"]["mean"] == 1
    assert LETTERS not in rows


def test_fewer_labels_than_the_server_fits_a_map_on_get_none():
    labels = leaning_lines("L", 30, seed=0)
    assert fit_maps(labels, range(20))[question_id(labels.items[0])] is not None
    # 7 labels: the server fits no map (question_maps' minimum), nor in any fold for abstention
    assert fit_maps(labels, range(7)) == {question_id(labels.items[0]): None}

    def as_served(count: int) -> dict[str, Reading]:
        validated = cross_validated(labels, range(count))
        return dict(
            zip((i.state for i in validated.items), validated.readings, strict=True)
        )

    plain = {labels.items[i].state: labels.readings[i] for i in range(20)}
    few = as_served(7)
    assert len(few) == 7 and few == {s: plain[s] for s in few}
    assert as_served(20) != plain


def test_letter_reads_get_the_same_rows_as_ours():
    """The letter rows are the no-labels and map rows applied to the letter reads: given reads that
    lean like ours they get our figures, and given flat reads their map lifts them as ours does."""
    labels = leaning_lines("L", 30, seed=0)
    heldout = leaning_lines("H", 200, seed=2)
    same = evaluate(labels, heldout, 2, 20, 0.8, letters=(labels, heldout))["rows"]
    assert same[LETTERS] == same[NO_LABELS]
    assert same[LETTERS_MAP] == same[QUESTION_MAP]
    flat = [Reading([0.0, 0.0], 1.0) for _ in labels.readings]
    letters = (Lines(labels.items, flat), heldout)
    rows = evaluate(labels, heldout, 2, 20, 0.8, letters=letters)["rows"]
    assert rows[LETTERS] == rows[NO_LABELS]  # the held-out letter reads are ours
    # labels read flat show no lean, so no letter map is kept
    assert rows[LETTERS_MAP]["types"]["noul"]["maps_kept"]["mean"] == 0


def test_a_question_without_labels_is_served_as_it_is():
    labels = leaning_lines("L", 30, seed=0)
    heldout = leaning_lines("H", 40, seed=2)
    for i in range(10):
        heldout.items.append(line(PLAIN, "yes" if i % 2 else "no", f"H{i}"))
        heldout.readings.append(Reading([float(i % 3), 0.0], 1.0))
    results = evaluate(labels, heldout, splits=2, per_question=20, precision=0.8)
    plain = question_id(heldout.items[-1])
    mapped = results["rows"][QUESTION_MAP]
    assert "kept" not in mapped["questions"][plain]
    assert (
        mapped["questions"][plain]["accuracy"]
        == results["rows"][NO_LABELS]["questions"][plain]["accuracy"]
    )
    assert mapped["types"]["noul"]["labelled"]["mean"] == 1
    assert set(results["majority"]) == {plain, question_id(labels.items[0])}


def test_labels_that_carry_no_lean_keep_no_map():
    """The model's scores already give the plain question's odds (each answer drawn from
    softmax(scores)): its labels show nothing the type's map lacks, and no map is kept."""
    rng = random.Random(0)
    labels = Lines([], [])
    for i in range(30):
        x = rng.gauss(0.0, 2.0)
        yes = rng.random() < 1 / (1 + math.exp(-x))
        labels.items.append(line(PLAIN, "yes" if yes else "no", f"L{i}"))
        labels.readings.append(Reading([x, 0.0], 1.0))
    assert fit_maps(labels, range(30)) == {question_id(labels.items[0]): None}


def test_one_answer_and_collapsed_counting():
    items = [line(LEANING, "yes" if i < 2 else "no", f"g{i}") for i in range(10)] + [
        line(PLAIN, "yes" if i % 2 else "no", f"g{i}") for i in range(10)
    ]
    says_yes = Reading([1.0, 0.0])
    says_no = Reading([0.0, 1.0])
    # the leaning question: every input "yes", right 2 times in 10; the plain one: mixed answers
    readings = [says_yes] * 10 + [says_yes, says_no] * 5
    assert one_answer(items, readings) == 1
    assert metrics(items, readings, 0)["collapsed"] == 1
    # a failed read doesn't make a question's answers differ, nor count
    readings[12] = Reading([], error="refused")
    assert one_answer(items, readings) == 1
    # a question asked once can't have collapsed
    assert one_answer(items[:1], readings[:1]) == 0


def test_majority_baseline_per_question():
    items = [
        line(LEANING, e, f"g{i}") for i, e in enumerate(["yes", "yes", "yes", "no"])
    ] + [line(PLAIN, e, f"g{i}") for i, e in enumerate(["yes", "no"])]
    shares = majority(items)
    assert shares == {question_id(items[0]): 0.75, question_id(items[4]): 0.5}
    hits = metrics(items, [Reading([1.0, 0.0])] * 6, 0)
    assert hits["majority_baseline"] == pytest.approx(4 / 6)
    # right on 4 of 6 at a stated 0.73 each: underconfident, and the figures show which way
    assert hits["accuracy"] == pytest.approx(4 / 6)
    assert hits["mean_confidence"] == pytest.approx(1 / (1 + math.exp(-1.0)))


def test_abstention_figures():
    items = [line(LEANING, "yes", f"g{i}") for i in range(4)]
    # confidences 0.88, 0.73, 0.5 (abstains), 0.88 on the wrong option
    readings = [
        Reading([2.0, 0.0]),
        Reading([1.0, 0.0]),
        Reading([0.0, 0.0]),
        Reading([0.0, 2.0]),
    ]
    rule = Abstention(
        precision_asked=0.8,
        threshold=0.7,
        precision_reached=0.9,
        precision_bound=0.8,
        coverage=0.5,
        answered=20,
        labels=40,
        groups=40,
    )
    figures = abstention_figures(items, readings, rule)
    assert figures["abstention_rate"] == pytest.approx(0.25)
    assert figures["precision_reached"] == pytest.approx(2 / 3)
    never = rule.model_copy(update={"threshold": None})
    assert abstention_figures(items, readings, never)["abstention_rate"] == 1.0
    assert abstention_figures(items, readings, never)["precision_reached"] is None


def test_reads_cache_asks_only_new_lines():
    labels = leaning_lines("L", 3, seed=0).items
    heldout = leaning_lines("H", 2, seed=0).items
    reads: dict = {"default": {}, "off": {}, "letters": {}}
    files = {"labels": labels, "heldout": heldout}
    assert len(missing(files, reads)) == 3 + 2 + 2 + 3 + 2
    for item in labels + heldout:
        reads["default"][line_key(item)] = {"scores": [0.0, 0.0], "temperature": 1.0}
        reads["letters"][line_key(item)] = {"scores": [0.0, 0.0], "temperature": 1.0}
    assert [(row, item.id) for row, item in missing(files, reads)] == [
        ("off", item.id) for item in heldout
    ]
    edited = line(LEANING, "yes", "H0", state="another input")
    assert line_key(edited) != line_key(heldout[0])
    assert len(missing({"labels": [], "heldout": [edited]}, reads)) == 3


def test_reads_of_another_model_are_refused(tmp_path):
    path = tmp_path / "reads.json"
    reads = {"default": {"k": {"scores": [0.0, 1.0], "temperature": 2.0}}, "off": {}}
    path.write_text(json.dumps({"model": "a", "reads": reads}))
    # a cache from before the letter reads: they are asked, the rest reused
    assert load_reads(str(path), "a") == {**reads, "letters": {}, "shown": {}}
    with pytest.raises(SystemExit, match="holds reads of a, not of b"):
        load_reads(str(path), "b")
    assert load_reads(str(tmp_path / "none.json"), "b") == {
        "default": {},
        "off": {},
        "letters": {},
        "shown": {},
    }


def overconfident_lines(prefix: str, count: int, seed: int) -> Lines:
    """A yes/no question read right 70% of the time, each answer at a confidence of about 0.98
    (scores 4 nats apart): overconfident, as a model read on another domain than its calibration
    set's is."""
    rng = random.Random(seed)
    out = Lines([], [])
    for i in range(count):
        yes = rng.random() < 0.5
        says_yes = yes if rng.random() < 0.7 else not yes
        margin = 4.0 + rng.uniform(-0.5, 0.5)
        out.items.append(line(PLAIN, "yes" if yes else "no", f"{prefix}{i}"))
        out.readings.append(
            Reading([margin if says_yes else 0.0, 0.0 if says_yes else margin], 1.0)
        )
    return out


def test_the_labels_as_calibration_file_refit_the_types_t():
    """Given as the server's calibration file, the labels refit an overconfident type's T (here far
    above 1), which takes held-out ECE down where the maps alone (pulled toward T = 1) leave it."""
    labels = overconfident_lines("L", 200, seed=0)
    heldout = overconfident_lines("H", 400, seed=1)
    fitted = fitted_temperatures(labels, range(120))
    assert fitted["noul"] > 2.0
    assert fitted_temperatures(labels, range(30)) == {"noul": 1.0}, "too few: T = 1"
    rows = evaluate(labels, heldout, splits=2, per_question=120, precision=0.8)["rows"]
    ece = {row: rows[row]["types"]["noul"]["ece_calibrated"]["mean"] for row in rows}
    assert ece[NO_LABELS] > 0.2
    assert ece[TYPE_T] < 0.08 and ece[TYPE_T_MAP] < 0.08
    accuracy = rows[TYPE_T]["types"]["noul"]["accuracy"]["mean"]
    assert accuracy == rows[NO_LABELS]["types"]["noul"]["accuracy"]["mean"], (
        "a T moves no answer"
    )


def test_the_ece_floor_is_what_a_calibrated_model_shows_on_as_many_answers():
    """At confidence 0.5 each answer is a fair coin, so ECE is |hits - n/2| / n, whose mean is about
    0.4 / sqrt(n); confident answers leave less room, and more answers shrink it."""
    assert ece_floor([0.5] * 100, seed=0, draws=2000) == pytest.approx(
        0.0399, abs=0.003
    )
    assert ece_floor([0.5] * 400, seed=0, draws=2000) == pytest.approx(
        0.0199, abs=0.002
    )
    assert ece_floor([0.95] * 100, seed=0) < ece_floor([0.6] * 100, seed=0)
    # reproducible for a seed
    assert ece_floor([0.5] * 100, seed=1) == ece_floor([0.5] * 100, seed=1)
