"""Both wire formats over the real decision service with a scripted backend."""

from __future__ import annotations

import math
from http import HTTPStatus

import pytest
from openai.types import Decision

from vllm.entrypoints.generate.decisions.errors import DecisionError
from vllm.entrypoints.generate.decisions.questions import content_text
from vllm.entrypoints.generate.decisions.service import DecisionService
from vllm.entrypoints.generate.decisions.settings import Settings
from vllm.entrypoints.generate.decisions.wire import jev, openai

from ..cases import JEV_INVALID, OPENAI_INVALID
from .fakes import ScriptedBackend


def descending(question):
    return [math.log(0.5**i) for i in range(len(question.options))]


@pytest.fixture
async def service():
    service = DecisionService(Settings.from_env({}), ScriptedBackend(descending), "served-model")
    await service.start()
    return service


OPENAI_REQUEST = {
    "model": "m",
    "input": "Ticket: payouts failing.",
    "questions": [
        {"type": "predicate", "name": "urgent", "instructions": "Urgent?"},
        {
            "type": "choice",
            "instructions": [{"type": "input_text", "text": "Which team?"}],
            "choices": [{"value": "billing", "description": "Payments"}, {"value": True}, {"value": "true"}],
        },
        {
            "type": "score",
            "name": "mood",
            "instructions": "Mood?",
            "levels": [{"label": "Calm"}, {"label": "Angry", "description": "shouting"}],
        },
    ],
}


async def test_openai_response_is_a_valid_decision(service):
    body = await openai.create_decision(service, OPENAI_REQUEST, "r")
    Decision.model_validate(body)
    predicate, choice, score = body["answers"]
    assert predicate["name"] == "urgent" and predicate["probability"] == pytest.approx(2 / 3)
    assert choice["name"] is None and choice["choice"] == "billing"
    assert [p["value"] for p in choice["probabilities"]] == ["billing", True, "true"]
    assert [p["label"] for p in score["probabilities"]] == ["Calm", "Angry"]
    assert score["score"] == pytest.approx(1 / 3)
    assert body["usage"]["input_tokens"] == 30 and body["usage"]["input_tokens_details"]["cached_tokens"] == 12
    assert body["extra"]["id"].startswith("decisions-")


async def test_detail_levels_trim_extra(service):
    none = await openai.create_decision(service, {**OPENAI_REQUEST, "extra": {"detail": "none"}}, "r")
    assert all("extra" not in a for a in none["answers"])
    basic = await openai.create_decision(service, {**OPENAI_REQUEST, "extra": {"detail": "basic"}}, "r")
    assert set(basic["answers"][0]["extra"]["backend"]) == {"name", "option_logits"}
    assert set(basic["answers"][0]["extra"]["audit"]) == {
        "calibration_temperature", "temperature_source", "temperature_scope", "readout", "forward_passes"
    }  # fmt: skip
    full = await openai.create_decision(service, OPENAI_REQUEST, "r")
    assert full["answers"][0]["extra"]["audit"]["temperature_scope"] == "server"


INVALID = [("openai", *case) for case in OPENAI_INVALID] + [("jev", *case) for case in JEV_INVALID]


@pytest.mark.parametrize(
    ("wire", "body", "needle"), [c[:1] + c[2:] for c in INVALID], ids=[f"{c[0]}: {c[1]}" for c in INVALID]
)
async def test_invalid_requests_name_the_field(service, wire, body, needle):
    create = openai.create_decision if wire == "openai" else jev.create_systemone
    with pytest.raises(DecisionError) as caught:
        await create(service, body, "r")
    assert caught.value.status == HTTPStatus.BAD_REQUEST
    assert needle in caught.value.message


async def test_openai_input_messages_are_joined_in_order(service):
    messages = [
        {"role": "user", "content": "first"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]},
    ]
    assert openai.input_text(messages) == "first\n\nsecond"


JEV_REQUEST = {
    "model": "jev-latest",
    "state": {"ticket": "payouts failing"},
    "questions": {
        "urgent 🚨": {"type": "noul", "instructions": "Urgent?", "criteria": {"true": "time-sensitive"}},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "tech": None}},
        "mood": {"type": "score", "instructions": "Mood?", "criteria": ["Calm", "Angry", "Furious"]},
    },
    "client_extra": {"ignored": True},
}


async def test_jev_response_shapes(service):
    body = await jev.create_systemone(service, JEV_REQUEST, "r")
    assert list(body["answers"]) == ["urgent 🚨", "team", "mood"]
    urgent, team, mood = body["answers"].values()
    assert set(urgent) == {"type", "noul", "extra"}
    assert team["choice"] == "billing" and set(team["probabilities"]) == {"billing", "tech"}
    assert mood["legend"] == {"0": "Calm", "1": "Angry", "2": "Furious"}
    assert body["usage"] == {"input_tokens": 30, "output_tokens": 3}
    assert body["id"].startswith("systemone-") and body["model"] == "served-model"


def test_jev_state_json_is_rendered_indented():
    assert content_text({"a": [1, 2]}) == '{\n  "a": [\n    1,\n    2\n  ]\n}'


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"questions": {"q": {"type": "noul", "instruction": "typo"}}}, ["body", "questions", "q", "instruction"]),
        ({"questions": {"q": {"type": "box"}}}, ["body", "questions", "q", "type"]),
        ({"questions": {"q": {"type": "score", "criteria": {"0": "a", "1": "b"}}}}, ["body", "questions", "q"]),
        ({"backend": "logit", "extra": {"backend": "logit"}}, ["body", "backend"]),
        ({"state": None}, ["body", "state"]),
    ],
)
async def test_jev_invalid_requests_point_at_the_field(service, change, loc):
    with pytest.raises(jev.JevValidationError) as caught:
        await jev.create_systemone(service, {**JEV_REQUEST, **change}, "r")
    assert caught.value.detail[0]["loc"][: len(loc)] == loc


async def test_same_question_same_probabilities_on_both_wires(service):
    both = [
        ({"type": "predicate", "instructions": "Urgent?"}, {"type": "noul", "instructions": "Urgent?"}),
        (
            {
                "type": "choice",
                "instructions": "Team?",
                "choices": [{"value": "a", "description": "x"}, {"value": "b"}],
            },
            {"type": "choice", "instructions": "Team?", "criteria": {"a": "x", "b": None}},
        ),
        (
            {"type": "score", "instructions": "Mood?", "levels": [{"label": "Calm"}, {"label": "Angry"}]},
            {"type": "score", "instructions": "Mood?", "criteria": ["Calm", "Angry"]},
        ),
    ]
    for openai_q, jev_q in both:
        _, _, _, (a,) = openai.parse_request({"model": "m", "input": "s", "questions": [openai_q]})
        _, _, _, (b,) = jev.parse_request({"state": "s", "questions": {"q": jev_q}})
        assert (a.qtype, a.instructions, [(o.key, o.text) for o in a.options]) == (
            b.qtype,
            b.instructions,
            [(o.key, o.text) for o in b.options],
        )


@pytest.mark.parametrize(
    "criteria",
    [None, {}, {"true": "time-sensitive"}, {"false": "can wait"}, {"true": "now", "false": "later"}, "absent"],
)
async def test_every_form_of_noul_criteria(service, criteria):
    question = {"type": "noul", "instructions": "Urgent?"}
    if criteria != "absent":
        question["criteria"] = criteria
    body = await jev.create_systemone(service, {"state": "s", "questions": {"q": question}}, "r")
    assert set(body["answers"]["q"]) == {"type", "noul", "extra"}


async def test_names_need_not_be_unique(service):
    questions = [{"type": "predicate", "name": "same", "instructions": "A?"}] * 2
    body = await openai.create_decision(service, {"model": "m", "input": "s", "questions": questions}, "r")
    assert [a["name"] for a in body["answers"]] == ["same", "same"]
