"""Probabilities worth trusting, on the shared SmolLM2 server: answers that don't depend on the order the
options were sent in. (Option log-probabilities in fp32 under a bf16 model, patches/exact-logprobs, are
tested on the engine in tests/engine/test_exact_logprobs.py and served in tests/server/test_templates.py.)"""

from __future__ import annotations

import json

import pytest

TICKETS = (
    "My payouts have been failing for 3 days and nobody answers.",
    "How do I change my password?",
    "I was charged twice for one order!",
    "Refund please, the item arrived broken.",
)
TEAMS = ["billing", "technical", "account", "sales", "shipping", "other"]


def ask(client, state, teams, **extra):
    body = {"model": "m", "input": state, "extra": extra,
            "questions": [{"type": "choice", "name": "team", "instructions": "Which team should handle this?",
                           "choices": [{"value": t} for t in teams]},
                          {"type": "score", "name": "anger", "instructions": "How frustrated is the customer?",
                           "levels": [{"label": x} for x in ("Calm", "Annoyed", "Frustrated", "Angry", "Furious")]}]}  # fmt: skip
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["answers"]


def test_rotate_gives_the_same_answer_whatever_the_order_sent(client):
    for state in TICKETS[:2]:
        # Once first, so every order below is read over the same cached blocks: a read computed afresh and
        # one over cached blocks may differ in the last digits (by a few hundredths in bf16).
        ask(client, state, TEAMS, debias="rotate")
        answers = [ask(client, state, order, debias="rotate") for order in (TEAMS, TEAMS[::-1], TEAMS[2:] + TEAMS[:2])]
        team = [{p["value"]: p["probability"] for p in a[0]["probabilities"]} for a in answers]
        assert team[1] == pytest.approx(team[0], abs=1e-6) and team[2] == pytest.approx(team[0], abs=1e-6)
        audit = answers[0][0]["extra"]["audit"]
        assert audit["debias"] == "rotate" and audit["forward_passes"] == 2 and len(audit["rotations"]) == 2
        chosen = json.dumps(answers[0][0]["choice"])
        tops = [r["top"] for r in audit["rotations"]]
        assert audit["rotation_agreement"] == sum(top == chosen for top in tops) / len(tops)
        # A score keeps its scale: the second reading is its levels reversed.
        score = answers[0][1]["extra"]["audit"]
        assert [r["reversed"] for r in score["rotations"]] == [False, True]


def test_off_reads_once_in_the_order_sent(client):
    (team, _) = ask(client, TICKETS[0], TEAMS, debias="off")
    assert team["extra"]["audit"]["forward_passes"] == 1 and "debias" not in team["extra"]["audit"]


def test_a_bad_debias_is_refused(client):
    body = {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "x?"}],
            "extra": {"debias": "shuffle"}}  # fmt: skip
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 400 and "debias" in response.text
