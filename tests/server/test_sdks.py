"""The OpenAI SDK and the TypeSafe SDK, unchanged, pointed at our server."""

from __future__ import annotations

import openai
import pytest
import typesafe_sdk
from openai.types import Decision

STATE = "Ticket: My payouts have been failing for 3 days."


@pytest.fixture
def openai_client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_openai_sdk_decisions_create(openai_client, server, client):
    questions = [
        {"type": "predicate", "name": "urgent", "instructions": "Is this urgent?"},
        {
            "type": "choice",
            "instructions": "Which team?",
            "choices": [
                {"value": "billing"},
                {"value": "technical", "description": "Bugs"},
                {"value": True},
            ],
        },
        {
            "type": "score",
            "name": "mood",
            "instructions": "Mood?",
            "levels": [{"label": "Calm"}, {"label": "Angry"}],
        },
    ]
    decision = openai_client.decisions.create(
        model=server.model,
        input=STATE,
        questions=questions,
        extra_body={"extra": {"detail": "basic"}},
    )
    assert isinstance(decision, Decision) and decision.model == server.model
    urgent, team, mood = decision.answers
    assert (
        urgent.type == "predicate"
        and urgent.name == "urgent"
        and 0 < urgent.probability < 1
    )
    assert (
        team.type == "choice"
        and team.name is None
        and team.choice in ("billing", "technical", True)
    )
    assert [p.value for p in team.probabilities] == ["billing", "technical", True]
    assert mood.type == "score" and [p.label for p in mood.probabilities] == [
        "Calm",
        "Angry",
    ]
    assert decision.usage.input_tokens > 0
    raw = client.post(
        "/v1/decisions", json={"model": "m", "input": STATE, "questions": questions}
    ).json()
    Decision.model_validate(raw)


def test_openai_sdk_sees_a_bad_request(openai_client):
    with pytest.raises(openai.BadRequestError, match="questions"):
        openai_client.decisions.create(model="m", input=STATE, questions=[])


def test_typesafe_sdk_system_one(server):
    client = typesafe_sdk.TypeSafeClient(api_key="unused", base_url=server.url)
    response = client.system_one(
        STATE,
        {
            "urgent": typesafe_sdk.Noul(instructions="Is this urgent?"),
            "team": typesafe_sdk.Choice(
                instructions="Which team?",
                criteria={"billing": "Payments", "tech": None},
            ),
            "mood": typesafe_sdk.Score(
                instructions="Mood?", criteria=["Calm", "Angry", "Furious"]
            ),
        },
    )
    assert response.model == server.model
    assert 0 < response.answers["urgent"].noul < 1
    assert response.answers["team"].choice in ("billing", "tech")
    assert set(response.answers["mood"].probabilities) == {0, 1, 2}


def test_typesafe_sdk_surfaces_our_422(server):
    client = typesafe_sdk.TypeSafeClient(api_key="unused", base_url=server.url)
    with pytest.raises(typesafe_sdk.TypeSafeUnprocessableEntityError, match="criteria"):
        client.system_one(
            STATE, {"q": {"type": "score", "criteria": {"0": "low", "1": "high"}}}
        )
