"""The bundled calibration questions: well-formed operator lines, balanced types, answers that fit their question."""

from __future__ import annotations

import json
from collections import Counter
from importlib.resources import files
from typing import Any

import pytest

PACKAGE = "vllm.entrypoints.generate.decisions.calibration"
REQUIRED = {"state", "question", "expected", "group", "id"}


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    # Loaded from the installed package, which also checks that the file ships with it.
    text = (files(PACKAGE) / "bundled.jsonl").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def by_type(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["question"]["type"] == kind]


def test_enough_well_formed_lines(records):
    assert len(records) >= 240
    for r in records:
        assert set(r) == REQUIRED, r.get("id")
        assert isinstance(r["state"], str) and r["state"].strip()
        assert isinstance(r["group"], str) and r["group"]
        assert (
            isinstance(r["question"]["instructions"], str)
            and r["question"]["instructions"].strip()
        )


def test_types_are_balanced(records):
    counts = Counter(r["question"]["type"] for r in records)
    assert set(counts) == {"noul", "choice", "score"}
    assert all(n >= 60 for n in counts.values()), counts


def test_expected_answers_fit_their_questions(records):
    for r in records:
        question, expected = r["question"], r["expected"]
        if question["type"] == "noul":
            assert expected in ("yes", "no"), r["id"]
            criteria = question.get("criteria")
            assert criteria is None or (
                isinstance(criteria, dict) and set(criteria) <= {"true", "false"}
            ), r["id"]
        elif question["type"] == "choice":
            options = question["criteria"]
            assert isinstance(options, dict) and 2 <= len(options) <= 6, r["id"]
            assert expected in options, r["id"]
        else:
            levels = question["criteria"]
            assert isinstance(levels, list) and 3 <= len(levels) <= 5, r["id"]
            assert isinstance(expected, int) and not isinstance(expected, bool), r["id"]
            assert 0 <= expected < len(levels), r["id"]


def test_ids_unique_and_groups_many(records):
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    assert len({r["group"] for r in records}) >= 80


def test_groups_share_their_state(records):
    # A group is one state's questions, so cross-validation never splits a state across folds.
    states: dict[str, set[str]] = {}
    for r in records:
        states.setdefault(r["group"], set()).add(r["state"])
    assert all(len(s) == 1 for s in states.values())


def test_yes_and_no_are_balanced(records):
    noul = by_type(records, "noul")
    share = sum(r["expected"] == "yes" for r in noul) / len(noul)
    assert 0.35 <= share <= 0.65


def test_correct_choice_is_not_always_first(records):
    positions = Counter(
        list(r["question"]["criteria"]).index(r["expected"])
        for r in by_type(records, "choice")
    )
    assert len(positions) >= 3
    assert positions[0] < 0.5 * sum(positions.values())


def test_score_answers_are_spread_over_levels(records):
    # If the answer were always the top or bottom level, a model could guess from position alone.
    scores = by_type(records, "score")
    lowest = sum(r["expected"] == 0 for r in scores)
    highest = sum(r["expected"] == len(r["question"]["criteria"]) - 1 for r in scores)
    assert lowest < 0.5 * len(scores) and highest < 0.5 * len(scores)
