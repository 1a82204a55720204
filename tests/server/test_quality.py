"""Probabilities worth trusting, on the shared SmolLM2 server (bf16): option log-probabilities in fp32
(patches/exact-logprobs), and answers that don't depend on the order the options were sent in."""

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


def top_tie(option_logits: dict[str, float]) -> bool:
    best = sorted(option_logits.values(), reverse=True)
    return best[0] == best[1]


def test_reads_are_fp32_under_the_bf16_model_and_say_so(server, client):
    ties = {"float32": 0, "model": 0}
    for state in TICKETS:
        for precision in ties:
            for answer in ask(client, state, TEAMS, backend_options={"precision": precision}):
                audit = answer["extra"]["audit"]
                assert audit["logit_precision"] == ("float32" if precision == "float32" else "bfloat16")
                ties[precision] += top_tie(answer["extra"]["backend"]["option_logits"])
    # Every option here is different: an exact tie is the bf16 grid, never the model's view.
    assert ties["float32"] == 0
    assert "option log-probabilities in float32, recomputed from the bfloat16 model" in server.log.read_text()


def test_rotate_gives_the_same_answer_whatever_the_order_sent(client):
    for state in TICKETS[:2]:
        # Once first, so every order below is read over the same cached blocks: on this CPU in bf16 a
        # read computed afresh and one over cached blocks differ by a few hundredths.
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
