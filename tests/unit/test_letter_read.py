"""The letter read of tools/quality (a user's own read on /v1/completions), without a server: the
prompt it renders and the option scores it takes from one token's top log-probabilities."""

from __future__ import annotations

import json
import math

import pytest

from tools.quality.letter_read import MASS_FLOOR, letter_messages, letter_scores
from vllm.entrypoints.generate.decisions.calibration import question_file


def log(p: float) -> float:
    return math.log(p)


def test_a_letter_with_and_without_a_space_is_one_answer():
    top = {"A": log(0.3), " A": log(0.2), "B": log(0.4), "The": log(0.05)}
    scores = letter_scores(top, 2)
    # folded, A (0.5) outranks B (0.4); read by spelling, B would win
    assert scores == pytest.approx([log(0.5), log(0.4)])
    assert scores[0] > scores[1]


def test_a_letter_only_spelled_with_a_space_counts():
    top = {" A": log(0.6), "B": log(0.35)}
    assert letter_scores(top, 2) == pytest.approx([log(0.6), log(0.35)])


def test_absent_letters_share_the_mass_left():
    top = {"A": log(0.5), " B": log(0.3), "x": log(0.15)}
    # C and D share 0.05 equally, below the least shown token (0.15)
    assert letter_scores(top, 4) == pytest.approx(
        [log(0.5), log(0.3), log(0.025), log(0.025)]
    )


def test_an_absent_letter_stays_below_every_shown_token():
    top = {"A": log(0.1), "x": log(0.02)}
    # 0.88 is left, but B ranked below "x": it gets at most 0.02
    assert letter_scores(top, 2) == pytest.approx([log(0.1), log(0.02)])


def test_an_absent_letter_gets_the_floor_when_nothing_is_left():
    top = {"A": log(0.7), "B": log(0.3)}
    assert letter_scores(top, 3) == pytest.approx([log(0.7), log(0.3), log(MASS_FLOOR)])
    lowercase = {"a": log(0.9), "b": log(0.1)}
    assert letter_scores(lowercase, 2) == pytest.approx([log(MASS_FLOOR)] * 2)


def test_the_prompt_letters_the_options_in_order():
    record = {
        "state": "The parcel never came.",
        "question": {
            "type": "choice",
            "instructions": "Which queue?",
            "criteria": {"payments": "Charges", "delivery": None, "account": "Login"},
        },
        "expected": "delivery",
    }
    item = question_file.parse_line(1, json.dumps(record))
    system, user = letter_messages(item)
    assert system["role"] == "system" and user["role"] == "user"
    assert user["content"].splitlines() == [
        "Document:",
        "The parcel never came.",
        "",
        "Question: Which queue?",
        "A. payments: Charges",
        "B. delivery",
        "C. account: Login",
        "",
        "Answer with one letter (A-C).",
    ]
