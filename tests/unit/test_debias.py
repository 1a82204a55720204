"""Debiasing (rotation.py, read.py) against a scripted backend whose reads carry a position bias: rotations put
options in a canonical order, cancel an additive position bias over a full cycle, keep a score's
scale, and report what they did."""

from __future__ import annotations

import itertools
import math

import pytest

from tests.unit.asking import read_question
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.rotation import (
    orders,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    NO_DEBIAS,
    Settings,
    SettingsError,
    parse_debias,
)

from .fakes import ScriptedBackend

# What the model "knows" about each option, and what the first positions add whatever sits there.
EVIDENCE = {"billing": 0.3, "technical": 0.1, "account": -0.2, "sales": 0.0}
POSITION_BIAS = [1.5, 0.7, 0.0, -0.4]


def biased(question):
    return [
        EVIDENCE.get(o.value, 0.0) + POSITION_BIAS[i]
        for i, o in enumerate(question.options)
    ]


def choice(order):
    return CHOICE.compile(
        ChoiceQuestion(instructions="Which team?", criteria={k: None for k in order})
    )


def log_softmax(values):
    total = math.log(sum(math.exp(v) for v in values))
    return [v - total for v in values]


async def test_off_reads_once_in_the_clients_order():
    backend = ScriptedBackend(biased)
    read = await read_question(
        backend,
        choice(["sales", "billing"]),
        ReadContext.about("s", "r", None),
        NO_DEBIAS,
    )
    assert read.reading.scores == pytest.approx([0.0 + 1.5, 0.3 + 0.7])
    assert read.reading.forward_passes == 1 and read.debias is None


async def test_a_full_rotation_is_independent_of_the_order_sent_and_cancels_the_position_bias():
    backend = ScriptedBackend(biased)
    full = parse_debias("rotate:4")
    truth = dict(zip(EVIDENCE, log_softmax(list(EVIDENCE.values())), strict=True))
    answers = []
    for order in itertools.permutations(EVIDENCE):
        reading = (
            await read_question(
                backend, choice(order), ReadContext.about("s", "r", None), full
            )
        ).reading
        assert reading.forward_passes == 4
        by_key = dict(zip(order, log_softmax(reading.scores), strict=True))
        assert by_key == pytest.approx(truth, abs=1e-9)
        answers.append(by_key)
    assert all(a == pytest.approx(answers[0]) for a in answers)


async def test_fewer_rotations_still_ignore_the_order_sent():
    backend = ScriptedBackend(biased)
    seen = set()
    for order in itertools.permutations(EVIDENCE):
        reading = (
            await read_question(
                backend,
                choice(order),
                ReadContext.about("s", "r", None),
                parse_debias("rotate:2"),
            )
        ).reading
        seen.add(
            tuple(
                round(s, 12) for _, s in sorted(zip(order, reading.scores, strict=True))
            )
        )
        assert reading.forward_passes == 2
    assert len(seen) == 1


async def test_the_audit_names_each_rotation_and_their_agreement():
    backend = ScriptedBackend(biased)
    read = await read_question(
        backend,
        choice(["sales", "billing", "account"]),
        ReadContext.about("s", "r", None),
        parse_debias("rotate:3"),
    )
    audit = read.debias
    assert (
        audit is not None and audit.debias == "rotate:3" and len(audit.rotations) == 3
    )
    # The canonical order is by key (the JSON text of the value): account, billing, sales.
    assert [r.first for r in audit.rotations] == ['"account"', '"billing"', '"sales"']
    # With this bias the first position wins every reading; only one of the three agrees with the answer.
    assert [r.top for r in audit.rotations] == ['"account"', '"billing"', '"sales"']
    assert audit.rotation_agreement == pytest.approx(1 / 3)


def test_a_score_keeps_its_scale_and_adds_the_reversed_reading():
    question = SCORE.compile(
        ScoreQuestion(instructions="How bad?", criteria=["low", "mid", "high"])
    )
    assert orders(question, parse_debias("rotate")) == [[0, 1, 2], [2, 1, 0]]
    assert orders(question, parse_debias("rotate:5")) == [[0, 1, 2], [2, 1, 0]]
    assert orders(question, parse_debias("rotate:1")) == [[0, 1, 2]]


def test_yes_no_reads_both_ways_and_a_large_choice_caps_its_rotations():
    noul = NOUL.compile(NoulQuestion(instructions="Urgent?"))
    assert sorted(orders(noul, parse_debias("rotate"))) == [[0, 1], [1, 0]]
    many = choice([f"team{i:02d}" for i in range(10)])
    rotations = orders(many, parse_debias("rotate"))
    assert [r[0] for r in rotations] == [0, 5] and rotations[1] == rotations[0][
        5:
    ] + rotations[0][:5]
    assert [r[0] for r in orders(many, parse_debias("rotate:4"))] == [0, 2, 5, 8]
    assert len(orders(many, parse_debias("rotate:10"))) == 10


async def test_rotations_of_a_score_report_reversed_readings():
    question = SCORE.compile(
        ScoreQuestion(instructions="How bad?", criteria=["low", "mid", "high"])
    )
    read = await read_question(
        ScriptedBackend(biased),
        question,
        ReadContext.about("s", "r", None),
        parse_debias("rotate"),
    )
    reading = read.reading
    assert read.debias is not None and [r.reversed for r in read.debias.rotations] == [
        False,
        True,
    ]
    # The bias favours the first position: low in one reading, high in the other; they cancel.
    assert reading.scores[0] == pytest.approx(reading.scores[2])


@pytest.mark.parametrize("text", ["rotate:0", "rotate:x", "spin", "off:2", "rotate:"])
def test_bad_settings_name_the_variable(text):
    with pytest.raises(SettingsError, match="VLLM_TYPED_DECISIONS_DEBIAS"):
        Settings.from_env({"VLLM_TYPED_DECISIONS_DEBIAS": text})


def test_settings_parse_each_form():
    assert str(Settings.from_env({}).debias) == "rotate:1", (
        "the default: one reading in the canonical order"
    )
    assert Settings.from_env({"VLLM_TYPED_DECISIONS_DEBIAS": "off"}).debias == NO_DEBIAS
    assert (
        str(Settings.from_env({"VLLM_TYPED_DECISIONS_DEBIAS": "ROTATE:3"}).debias)
        == "rotate:3"
    )
