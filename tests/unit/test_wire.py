"""Both wire formats over the real decision service with a scripted backend."""

from __future__ import annotations

import math
from http import HTTPStatus

import httpx
import pytest
from fastapi import FastAPI
from openai.types import Decision

from vllm.entrypoints.generate.decisions.decide.budget import RenderBudget
from vllm.entrypoints.generate.decisions.decide.questions import content_text
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.validation import detail_message
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)
from vllm.entrypoints.generate.decisions.http.wire.jev import serving as jev
from vllm.entrypoints.generate.decisions.http.wire.jev.protocol import SystemOneRequest
from vllm.entrypoints.generate.decisions.http.wire.openai import serving as openai
from vllm.entrypoints.generate.decisions.http.wire.openai.protocol import (
    DecisionsRequest,
)

from ..cases import JEV_INVALID, OPENAI_INVALID
from .fakes import ScriptedBackend


def descending(question):
    return [math.log(0.5**i) for i in range(len(question.options))]


@pytest.fixture
async def app():
    """The decision routes on a bare FastAPI app, over a scripted model: the whole HTTP path but the engine."""
    app = FastAPI()
    register_decisions_api_router(app)
    app.state.decision_service = DecisionService(
        Settings.from_env({}), ScriptedBackend(descending), "served-model"
    )
    await app.state.decision_service.start()
    return app


async def post(app: FastAPI, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://wire"
    ) as client:
        return await client.post(path, json=body)


async def decide(app: FastAPI, body: dict) -> dict:
    response = await post(app, "/v1/decisions", body)
    assert response.status_code == 200, response.text
    return response.json()


async def systemone(app: FastAPI, body: dict) -> dict:
    response = await post(app, "/v1/systemone", body)
    assert response.status_code == 200, response.text
    return response.json()


OPENAI_REQUEST = {
    "model": "m",
    "input": "Ticket: payouts failing.",
    "questions": [
        {"type": "predicate", "name": "urgent", "instructions": "Urgent?"},
        {
            "type": "choice",
            "instructions": [{"type": "input_text", "text": "Which team?"}],
            "choices": [
                {"value": "billing", "description": "Payments"},
                {"value": True},
                {"value": "true"},
            ],
        },
        {
            "type": "score",
            "name": "mood",
            "instructions": "Mood?",
            "levels": [
                {"label": "Calm"},
                {"label": "Angry", "description": "shouting"},
            ],
        },
    ],
}


async def test_openai_response_is_a_valid_decision(app):
    body = await decide(app, OPENAI_REQUEST)
    Decision.model_validate(body)
    predicate, choice, score = body["answers"]
    assert predicate["name"] == "urgent" and predicate["probability"] == pytest.approx(
        2 / 3
    )
    assert choice["name"] is None and choice["choice"] == "billing"
    assert [p["value"] for p in choice["probabilities"]] == ["billing", True, "true"]
    assert [p["label"] for p in score["probabilities"]] == ["Calm", "Angry"]
    assert score["score"] == pytest.approx(1 / 3)
    assert (
        body["usage"]["input_tokens"] == 30
        and body["usage"]["input_tokens_details"]["cached_tokens"] == 12
    )
    assert body["extra"]["id"].startswith("decisions-")


async def test_detail_levels_trim_extra(app):
    none = await decide(app, {**OPENAI_REQUEST, "extra": {"detail": "none"}})
    assert all("extra" not in a for a in none["answers"])
    basic = await decide(app, {**OPENAI_REQUEST, "extra": {"detail": "basic"}})
    assert set(basic["answers"][0]["extra"]["backend"]) == {"name", "option_logits"}
    assert set(basic["answers"][0]["extra"]["audit"]) == {
        "calibration_temperature",
        "temperature_source",
        "temperature_scope",
        "calibration_stage",
        "readout",
        "forward_passes",
    }
    full = await decide(app, OPENAI_REQUEST)
    assert full["answers"][0]["extra"]["audit"]["temperature_scope"] == "server"


INVALID = [("openai", *case) for case in OPENAI_INVALID] + [
    ("jev", *case) for case in JEV_INVALID
]


@pytest.mark.parametrize(
    ("wire", "body", "needle"),
    [c[:1] + c[2:] for c in INVALID],
    ids=[f"{c[0]}: {c[1]}" for c in INVALID],
)
async def test_invalid_requests_name_the_field(app, wire, body, needle):
    response = await post(
        app, "/v1/decisions" if wire == "openai" else "/v1/systemone", body
    )
    if wire == "openai":
        assert response.status_code == HTTPStatus.BAD_REQUEST, response.text
        message = response.json()["error"]["message"]
    else:
        assert response.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, response.text
        message = detail_message(response.json()["detail"])
    assert needle in message


async def test_openai_input_messages_are_joined_in_order(app):
    messages = [
        {"role": "user", "content": "first"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "second"}],
        },
    ]
    assert openai.input_text(messages, RenderBudget()) == "first\n\nsecond"


JEV_REQUEST = {
    "model": "jev-latest",
    "state": {"ticket": "payouts failing"},
    "questions": {
        "urgent 🚨": {
            "type": "noul",
            "instructions": "Urgent?",
            "criteria": {"true": "time-sensitive"},
        },
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "Payments", "tech": None},
        },
        "mood": {
            "type": "score",
            "instructions": "Mood?",
            "criteria": ["Calm", "Angry", "Furious"],
        },
    },
    "client_extra": {"ignored": True},
}


async def test_jev_response_shapes(app):
    body = await systemone(app, JEV_REQUEST)
    assert list(body["answers"]) == ["urgent 🚨", "team", "mood"]
    urgent, team, mood = body["answers"].values()
    assert set(urgent) == {"type", "noul", "extra"}
    assert team["choice"] == "billing" and set(team["probabilities"]) == {
        "billing",
        "tech",
    }
    assert mood["legend"] == {"0": "Calm", "1": "Angry", "2": "Furious"}
    assert body["usage"] == {"input_tokens": 30, "output_tokens": 3}
    assert body["id"].startswith("systemone-") and body["model"] == "served-model"


def test_jev_state_json_is_rendered_indented():
    assert content_text({"a": [1, 2]}) == '{\n  "a": [\n    1,\n    2\n  ]\n}'


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        (
            {"questions": {"q": {"type": "noul", "instruction": "typo"}}},
            ["body", "questions", "q", "instruction"],
        ),
        ({"questions": {"q": {"type": "box"}}}, ["body", "questions", "q", "type"]),
        (
            {"questions": {"q": {"type": "score", "criteria": {"0": "a", "1": "b"}}}},
            ["body", "questions", "q"],
        ),
        ({"backend": "logit", "extra": {"backend": "logit"}}, ["body", "backend"]),
        ({"state": None}, ["body", "state"]),
    ],
)
async def test_jev_invalid_requests_point_at_the_field(app, change, loc):
    response = await post(app, "/v1/systemone", {**JEV_REQUEST, **change})
    assert response.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, response.text
    assert response.json()["detail"][0]["loc"][: len(loc)] == loc


async def test_same_question_same_probabilities_on_both_wires(app):
    both = [
        (
            {"type": "predicate", "instructions": "Urgent?"},
            {"type": "noul", "instructions": "Urgent?"},
        ),
        (
            {
                "type": "choice",
                "instructions": "Team?",
                "choices": [{"value": "a", "description": "x"}, {"value": "b"}],
            },
            {
                "type": "choice",
                "instructions": "Team?",
                "criteria": {"a": "x", "b": None},
            },
        ),
        (
            {
                "type": "score",
                "instructions": "Mood?",
                "levels": [{"label": "Calm"}, {"label": "Angry"}],
            },
            {"type": "score", "instructions": "Mood?", "criteria": ["Calm", "Angry"]},
        ),
    ]
    settings = Settings.from_env({"VLLM_TYPED_DECISIONS_MAX_INPUT_CHARS": "1000"})
    for openai_q, jev_q in both:
        _, asked_openai = openai.compiled(
            DecisionsRequest.model_validate(
                {"model": "m", "input": "s", "questions": [openai_q]}
            ),
            "r",
            settings,
        )
        _, asked_jev = jev.compiled(
            SystemOneRequest.model_validate({"state": "s", "questions": {"q": jev_q}}),
            "r",
            settings,
        )
        (a,), (b,) = asked_openai.questions, asked_jev.questions
        assert (a.qtype, a.instructions, [(o.key, o.text) for o in a.options]) == (
            b.qtype,
            b.instructions,
            [(o.key, o.text) for o in b.options],
        )


@pytest.mark.parametrize(
    "criteria",
    [
        None,
        {},
        {"true": "time-sensitive"},
        {"false": "can wait"},
        {"true": "now", "false": "later"},
        "absent",
    ],
)
async def test_every_form_of_noul_criteria(app, criteria):
    question = {"type": "noul", "instructions": "Urgent?"}
    if criteria != "absent":
        question["criteria"] = criteria
    body = await systemone(app, {"state": "s", "questions": {"q": question}})
    assert set(body["answers"]["q"]) == {"type", "noul", "extra"}


async def test_names_need_not_be_unique(app):
    questions = [{"type": "predicate", "name": "same", "instructions": "A?"}] * 2
    body = await decide(app, {"model": "m", "input": "s", "questions": questions})
    assert [a["name"] for a in body["answers"]] == ["same", "same"]
