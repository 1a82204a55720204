"""An error message quotes at most a short prefix of any value a client sent (decide/errors.py's
``shown``): a megabyte-long backend name, question type, Jev question id, model name, field name,
tag, call id, option label or request id comes back as a prefix and its length, in each wire's error
shape, while the message still names the field; a short value is quoted exactly as before."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import pytest

from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    shown,
)
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.validation import detail_message
from vllm.entrypoints.generate.decisions.http.wire.handling import Reply, Wire
from vllm.entrypoints.generate.decisions.http.wire.jev.api_router import JEV
from vllm.entrypoints.generate.decisions.http.wire.openai.api_router import OPENAI
from vllm.entrypoints.generate.decisions.runtime.adapters import ServedModels

from .fakes import ScriptedBackend, TokenizerHost
from .test_adapters import serving_models
from .test_wire import JEV_REQUEST, OPENAI_REQUEST, descending

MEGABYTE = 1 << 20
LONG = "x" * MEGABYTE
# What a refusal's whole body may weigh, whatever the client sent.
MOST_BYTES = 2048


@pytest.fixture
async def service() -> DecisionService:
    service = DecisionService(
        Settings.from_env({}), ScriptedBackend(descending), "served-model"
    )
    await service.start()
    return service


async def answer(wire: Wire, service: Any, body: dict, request_id: str = "r") -> Reply:
    return await wire.answer(lambda: service, body, request_id)


def openai_message(reply: Reply, status: int = HTTPStatus.BAD_REQUEST) -> str:
    """The OpenAI wire's refusal message, once its whole body is checked to be short."""
    assert reply.status_code == status, reply.body
    assert len(json.dumps(reply.json())) < MOST_BYTES
    return reply.json()["error"]["message"]


def jev_detail(reply: Reply) -> list[dict[str, Any]]:
    """The Jev wire's 422 entries, once its whole body is checked to be short."""
    assert reply.status_code == HTTPStatus.UNPROCESSABLE_ENTITY, reply.body
    assert len(json.dumps(reply.json())) < MOST_BYTES
    return reply.json()["detail"]


def cut(value: str) -> str:
    return f"'{value[:64]}…' ({len(value)} characters)"


def jev_body(question_id: str, question: dict, **change: Any) -> dict:
    return {**JEV_REQUEST, "questions": {question_id: question}, **change}


# --- the helper -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["abc", "", "it's", "x" * 64, None, True, 3, ["a", 1], {"k": "v"}]
)
def test_a_short_value_is_its_repr(value):
    assert shown(value) == repr(value)


def test_a_long_value_is_a_prefix_and_its_length():
    assert shown(LONG) == cut(LONG)
    assert shown("é" * 100, limit=3) == "'ééé…' (100 characters)"
    assert shown("it's\"" * 20, limit=4) == '"it\'s…" (100 characters)'
    many = ["y" * 10] * 1000
    assert shown(many) == f"{repr(many)[:64]}… ({len(repr(many))} characters)"


def test_bare_shows_a_short_string_as_it_is():
    assert shown("urgent", bare=True) == "urgent"
    assert shown(LONG, bare=True) == cut(LONG)


# --- the OpenAI wire --------------------------------------------------------------------------------


async def test_openai_extra_backend(service):
    reply = await answer(
        OPENAI, service, {**OPENAI_REQUEST, "extra": {"backend": LONG}}
    )
    message = openai_message(reply)
    assert message.startswith(f"extra.backend={cut(LONG)}: unknown backend")
    short = await answer(
        OPENAI, service, {**OPENAI_REQUEST, "extra": {"backend": "nope"}}
    )
    assert openai_message(short).startswith(
        "extra.backend='nope': unknown backend; loaded backends: "
    )


async def test_openai_question_type(service):
    for kind, quoted in [(LONG, cut(LONG)), ("ranking", "'ranking'")]:
        body = {**OPENAI_REQUEST, "questions": [{"type": kind, "instructions": "x"}]}
        message = openai_message(await answer(OPENAI, service, body))
        assert message.startswith(f"questions[0].type: unknown question type {quoted}")


@pytest.mark.parametrize("where", ["top", "extra", "question"])
async def test_openai_unknown_field_names(service, where):
    for name, named in [(LONG, cut(LONG)), ("temperature", "temperature")]:
        if where == "top":
            body, path = {**OPENAI_REQUEST, name: 1}, named
        elif where == "extra":
            body, path = {**OPENAI_REQUEST, "extra": {name: 1}}, f"extra.{named}"
        else:
            question = {"type": "predicate", "instructions": "x", name: 1}
            body, path = (
                {**OPENAI_REQUEST, "questions": [question]},
                (f"questions[0].{named}"),
            )
        message = openai_message(await answer(OPENAI, service, body))
        assert f"{path}: Extra inputs are not permitted" in message


async def test_openai_input_part_tag(service):
    for tag, quoted in [(LONG, cut(LONG)), ("input_audio", "'input_audio'")]:
        parts = [{"type": tag, "text": "a"}]
        body = {**OPENAI_REQUEST, "input": [{"role": "user", "content": parts}]}
        message = openai_message(await answer(OPENAI, service, body))
        assert (
            f"input[0].content[0]: Input tag {quoted} found using 'type' does not match"
            in message
        )


async def test_openai_call_id(service):
    for call_id in (LONG, "call_1"):
        item = {"type": "function_call_output", "call_id": call_id, "output": "ok"}
        body = {**OPENAI_REQUEST, "input": [item]}
        message = openai_message(await answer(OPENAI, service, body))
        assert message == (
            f"input[0].call_id: no earlier tool call has call_id {shown(call_id)}"
        )
    assert shown("call_1") == "'call_1'"


@pytest.mark.vllm032
async def test_unknown_model_in_each_wire(service):
    models = ServedModels(service, serving_models())
    for model in (LONG, "nope"):
        named = f"`{model}`" if model == "nope" else f"`{cut(model)}`"
        message = openai_message(
            await answer(OPENAI, models, {**OPENAI_REQUEST, "model": model}),
            HTTPStatus.NOT_FOUND,
        )
        assert message.startswith(f"The model {named} does not exist.")
        reply = await answer(JEV, models, {**JEV_REQUEST, "model": model})
        assert reply.status_code == HTTPStatus.NOT_FOUND
        assert len(json.dumps(reply.json())) < MOST_BYTES
        message = reply.json()["detail"]["message"]
        assert message.startswith(f"The model {named} does not exist.")


# --- the Jev wire -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["top", "extra"])
async def test_jev_backend(service, where):
    for name in (LONG, "nope"):
        change = {"backend": name} if where == "top" else {"extra": {"backend": name}}
        detail = jev_detail(await answer(JEV, service, {**JEV_REQUEST, **change}))
        assert detail[0]["loc"] == ["body"]
        assert detail[0]["msg"].startswith(
            f"extra.backend={shown(name)}: unknown backend"
        )


async def test_jev_question_type_and_id(service):
    for question_id, kind in [(LONG, "ranking"), ("q1", LONG), ("q1", "ranking")]:
        body = jev_body(question_id, {"type": kind, "instructions": "x"})
        detail = jev_detail(await answer(JEV, service, body))
        named = shown(question_id, bare=True)
        assert detail[0]["loc"] == ["body", "questions", named, "type"]
        assert detail[0]["msg"].startswith(f"unknown question type {shown(kind)}")
    assert detail == [
        {
            "loc": ["body", "questions", "q1", "type"],
            "msg": "unknown question type 'ranking'",
            "type": "value_error",
        }
    ]


async def test_jev_question_id_in_a_question_error(service):
    for question_id in (LONG, "q1"):
        named = shown(question_id, bare=True)
        body = jev_body(question_id, {"type": "noul", "instructions": "x", "extra": 1})
        detail = jev_detail(await answer(JEV, service, body))
        assert detail == [
            {
                "loc": ["body", "questions", named, "extra"],
                "msg": "Extra inputs are not permitted",
                "type": "extra_forbidden",
            }
        ]
        assert detail_message(detail) == (
            f"questions.{named}.extra: Extra inputs are not permitted"
        )


async def test_jev_question_id_over_a_limit(service):
    criteria = {f"c{i}": None for i in range(service.settings.max_choices + 1)}
    for question_id in (LONG, "q1"):
        body = jev_body(question_id, {"type": "choice", "criteria": criteria})
        detail = jev_detail(await answer(JEV, service, body))
        named = shown(question_id, bare=True)
        assert detail[0]["msg"].startswith(f"questions.{named} has {len(criteria)}")


@pytest.mark.parametrize("where", ["extra", "question"])
async def test_jev_unknown_field_names(service, where):
    for name in (LONG, "temperature"):
        if where == "extra":
            body, loc = {**JEV_REQUEST, "extra": {name: 1}}, ["extra"]
        else:
            body = jev_body("q1", {"type": "noul", name: 1})
            loc = ["questions", "q1"]
        detail = jev_detail(await answer(JEV, service, body))
        assert detail[0]["loc"] == ["body", *loc, shown(name, bare=True)]
        assert detail[0]["msg"] == "Extra inputs are not permitted"


# --- option labels --------------------------------------------------------------------------------


async def test_a_long_option_label(smollm2_tokenizer):
    host = TokenizerHost(smollm2_tokenizer)
    rendered = await host.render_chat([{"role": "user", "content": "Pick one."}])
    placer = AnswerSlotPlacer(host)
    blank = " " * MEGABYTE
    with pytest.raises(DecisionError) as refused:
        placer.place(rendered, ["A", blank])
    assert refused.value.message == f"option label {cut(blank)} is blank"
    words = "ab " * (MEGABYTE // 3)
    with pytest.raises(DecisionError) as refused:
        placer.place(rendered, ["A", words])
    assert refused.value.message == (
        f"option label {cut(words)} is not a single token after the answer cue"
    )
    with pytest.raises(DecisionError) as refused:
        placer.place(rendered, ["A", "ab cd"])
    assert refused.value.message == (
        "option label 'ab cd' is not a single token after the answer cue"
    )
