"""Probabilities worth trusting, on the shared SmolLM2 server: answers that don't depend on the order the
options were sent in. (Option log-probabilities in fp32 under a bf16 model, patches/exact-logprobs, are
tested on the engine in tests/engine/test_exact_logprobs.py and served in tests/server/test_templates.py.)"""

from __future__ import annotations

import json
import math

import pytest

TICKETS = (
    "My payouts have been failing for 3 days and nobody answers.",
    "How do I change my password?",
    "I was charged twice for one order!",
    "Refund please, the item arrived broken.",
)
TEAMS = ["billing", "technical", "account", "sales", "shipping", "other"]


def ask(client, state, teams, **extra):
    body = {
        "model": "m",
        "input": state,
        "extra": extra,
        "questions": [
            {
                "type": "choice",
                "name": "team",
                "instructions": "Which team should handle this?",
                "choices": [{"value": t} for t in teams],
            },
            {
                "type": "score",
                "name": "anger",
                "instructions": "How frustrated is the customer?",
                "levels": [
                    {"label": x}
                    for x in ("Calm", "Annoyed", "Frustrated", "Angry", "Furious")
                ],
            },
        ],
    }
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["answers"]


def test_rotate_gives_the_same_answer_whatever_the_order_sent(client):
    for state in TICKETS[:2]:
        # Once first, so every order below is read over the same cached blocks: a read computed afresh and
        # one over cached blocks may differ in the last digits (by a few hundredths in bf16).
        ask(client, state, TEAMS, debias="rotate")
        answers = [
            ask(client, state, order, debias="rotate")
            for order in (TEAMS, TEAMS[::-1], TEAMS[2:] + TEAMS[:2])
        ]
        team = [
            {p["value"]: p["probability"] for p in a[0]["probabilities"]}
            for a in answers
        ]
        assert team[1] == pytest.approx(team[0], abs=1e-6) and team[2] == pytest.approx(
            team[0], abs=1e-6
        )
        audit = answers[0][0]["extra"]["audit"]
        assert (
            audit["debias"] == "rotate"
            and audit["forward_passes"] == 2
            and len(audit["rotations"]) == 2
        )
        chosen = json.dumps(answers[0][0]["choice"])
        tops = [r["top"] for r in audit["rotations"]]
        assert audit["rotation_agreement"] == sum(top == chosen for top in tops) / len(
            tops
        )
        # A score keeps its scale: the second reading is its levels reversed.
        score = answers[0][1]["extra"]["audit"]
        assert [r["reversed"] for r in score["rotations"]] == [False, True]


def test_off_reads_once_in_the_order_sent(client):
    (team, _) = ask(client, TICKETS[0], TEAMS, debias="off")
    assert (
        team["extra"]["audit"]["forward_passes"] == 1
        and "debias" not in team["extra"]["audit"]
    )


def test_the_default_reads_once_whatever_the_order_sent(client):
    state = TICKETS[2]
    ask(client, state, TEAMS)  # the blocks cached first, as above
    answers = [
        ask(client, state, order)
        for order in (TEAMS, TEAMS[::-1], TEAMS[3:] + TEAMS[:3])
    ]
    team = [
        {p["value"]: p["probability"] for p in a[0]["probabilities"]} for a in answers
    ]
    assert team[1] == pytest.approx(team[0], abs=1e-6) and team[2] == pytest.approx(
        team[0], abs=1e-6
    )
    audit = answers[0][0]["extra"]["audit"]
    assert audit["debias"] == "rotate:1" and audit["forward_passes"] == 1
    assert audit["rotations"][0]["first"] == '"account"', (
        "the canonical order: sorted by the text shown"
    )


def test_a_content_free_prior_is_read_once_per_question_and_equal_on_both_wires(client):
    question = {
        "instructions": "Which team should own this? (prior test)",
        "choices": TEAMS[:3],
    }
    openai = {
        "model": "m",
        "input": TICKETS[3],
        "extra": {"prior": "content-free"},
        "questions": [
            {
                "type": "choice",
                "instructions": question["instructions"],
                "choices": [{"value": t} for t in question["choices"]],
            }
        ],
    }
    jev = {
        "model": "m",
        "state": TICKETS[3],
        "extra": {"prior": "content-free"},
        "questions": {
            "team": {
                "type": "choice",
                "instructions": question["instructions"],
                "criteria": {t: None for t in question["choices"]},
            }
        },
    }
    first = client.post("/v1/decisions", json=openai).json()["answers"][0]
    prior = first["extra"]["audit"]["prior"]
    assert prior["mode"] == "content-free" and set(prior["content_free"]) == {
        json.dumps(t) for t in TEAMS[:3]
    }
    raw = first["extra"]["backend"]["option_logits"]
    # The adjusted scores are the reading's log-probabilities less the prior, exactly.
    total = math.log(sum(math.exp(v) for v in raw.values()))
    for key, value in prior["adjusted_logits"].items():
        assert value == pytest.approx(
            raw[key] - total - prior["content_free"][key], abs=1e-9
        )
    # The same question about another input: the prior comes from the cache; on the other wire too.
    other = client.post("/v1/decisions", json={**openai, "input": TICKETS[0]}).json()[
        "answers"
    ][0]
    assert other["extra"]["audit"]["prior"]["cached"] is True
    assert other["extra"]["audit"]["prior"]["content_free"] == prior["content_free"]
    team = client.post("/v1/systemone", json=jev).json()["answers"]["team"]
    assert team["extra"]["audit"]["prior"]["cached"] is True
    assert team["probabilities"] == pytest.approx(
        {p["value"]: p["probability"] for p in first["probabilities"]}
    )


def test_a_bad_prior_is_refused_and_a_fitted_one_needs_a_calibration(client):
    body = {
        "model": "m",
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "x?"}],
        "extra": {"prior": "learned"},
    }
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 400 and "prior" in response.text
    # This server runs without calibration: there is no bias to apply.
    response = client.post("/v1/decisions", json={**body, "extra": {"prior": "fitted"}})
    assert (
        response.status_code == 400
        and "no position bias was fitted for noul questions" in response.text
    )


def test_a_bad_debias_is_refused(client):
    body = {
        "model": "m",
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "x?"}],
        "extra": {"debias": "shuffle"},
    }
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 400 and "debias" in response.text
