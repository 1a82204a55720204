"""A third-party plugin (tests/plugin, installed with real entry points) on real servers: its backend
and question type on both endpoints, selection by architecture claim, variable and request, and bad
backend settings stopping the server."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types import Decision

from ..conftest import model_path
from .conftest import VllmServer, answered, running

SENTIMENT_JEV = {
    "state": "I love this phone, the battery lasts for days!",
    "questions": {
        "mood": {"type": "sentiment"},
        "buy": {"type": "noul", "instructions": "Recommend?"},
    },
}
SENTIMENT_OPENAI = {
    "model": "m",
    "input": "I love this phone, the battery lasts for days!",
    "questions": [
        {"type": "sentiment", "name": "mood"},
        {"type": "predicate", "instructions": "Recommend?"},
    ],
}


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory):
    """Qwen2 architecture, no backend configured: the plugin's claim picks plain-letters."""
    log = tmp_path_factory.mktemp("plugin") / "vllm-serve.log"
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
    }
    with running("tiny-qwen2-random", log, env) as instance:
        yield instance


def test_plugins_load_and_the_architecture_claim_picks_the_plugin_backend(
    plugin_server,
):
    log = plugin_server.log.read_text()
    loaded = next(
        line for line in log.splitlines() if "decision plugins loaded:" in line
    )
    for plugin in (
        "backend plain-letters",
        "backend faulty",
        "question type sentiment",
    ):
        assert plugin in loaded
    assert "backend plain-letters (chosen for the model)" in log
    # The test plugin keeps the read(state, question, request_id, options) it was written with: it works
    # (the answers below), and the operator is told it is deprecated.
    assert (
        "decision backend 'plain-letters' implements the deprecated read(state, question, request_id"
        in log
    )


@pytest.mark.parametrize("backend", [None, "logit"])
def test_both_endpoints_answer_the_plugin_type(plugin_server, backend):
    extra = {"backend": backend} if backend else {}
    expected = backend or "plain-letters"
    mood = answered(plugin_server, "/v1/systemone", {**SENTIMENT_JEV, "extra": extra})[
        "answers"
    ]["mood"]
    assert mood["type"] == "sentiment" and mood["label"] in (
        "negative",
        "neutral",
        "positive",
    )
    assert (
        list(mood["probabilities"]) == ["negative", "neutral", "positive"]
        and 0 <= mood["confidence"] <= 1
    )
    assert mood["positive_minus_negative"] == pytest.approx(
        mood["probabilities"]["positive"] - mood["probabilities"]["negative"]
    )
    assert mood["extra"]["backend"]["name"] == expected

    body = answered(
        plugin_server, "/v1/decisions", {**SENTIMENT_OPENAI, "extra": extra}
    )
    mood, recommend = body["answers"]
    assert (mood["type"], mood["name"]) == ("sentiment", "mood") and mood["label"] in (
        "negative",
        "neutral",
        "positive",
    )
    assert (
        recommend["type"] == "predicate"
        and recommend["extra"]["backend"]["name"] == expected
    )


def test_the_openai_sdk_reads_a_plugin_answer(plugin_server):
    client = openai.OpenAI(
        base_url=f"{plugin_server.url}/v1", api_key="unused", max_retries=0
    )
    decision = client.decisions.create(
        model="m",
        input=SENTIMENT_OPENAI["input"],
        questions=SENTIMENT_OPENAI["questions"],
    )
    assert isinstance(decision, Decision)
    assert decision.answers[0].label in ("negative", "neutral", "positive")  # type: ignore[union-attr]


def test_plugin_backend_options_are_validated_by_its_model(plugin_server):
    body = answered(
        plugin_server,
        "/v1/systemone",
        {**SENTIMENT_JEV, "extra": {"backend_options": {"space": True}}},
    )
    assert body["answers"]["mood"]["extra"]["backend"]["space"] is True
    bad = httpx.post(
        plugin_server.url + "/v1/decisions",
        json={**SENTIMENT_OPENAI, "extra": {"backend_options": {"spaces": 1}}},
        timeout=60,
    )
    assert (
        bad.status_code == 400
        and "extra.backend_options.spaces" in bad.json()["error"]["message"]
    )


def test_an_unknown_backend_is_refused_with_the_loaded_ones(plugin_server):
    response = httpx.post(
        plugin_server.url + "/v1/decisions",
        json={**SENTIMENT_OPENAI, "extra": {"backend": "diffusion"}},
        timeout=60,
    )
    assert response.status_code == 400
    assert (
        "loaded backends: canvas, encoder, faulty, logit, plain-letters"
        in response.json()["error"]["message"]
    )


def test_a_request_picks_the_plugin_backend_on_a_model_it_does_not_claim(client):
    body = client.post(
        "/v1/systemone", json={**SENTIMENT_JEV, "extra": {"backend": "plain-letters"}}
    ).json()
    assert body["answers"]["mood"]["extra"]["backend"]["name"] == "plain-letters"
    assert (
        body["answers"]["buy"]["extra"]["audit"]["render_version"] == "plain-letters-1"
    )


def test_a_configured_backend_wins_over_the_claim(tiny_qwen_server):
    assert "backend logit (configured)" in tiny_qwen_server.log.read_text()


def test_bad_backend_settings_stop_the_server(tmp_path):
    """One served case; every refusal's message (an unknown backend, a bad argument) is a unit test
    (tests/unit/test_backends.py)."""
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit:speed=2",
    }
    server = VllmServer(model_path("tiny-llama-localtok"), tmp_path / "bad.log", env)
    try:
        assert server.process.wait(timeout=300) != 0
    finally:
        server.stop()
    log = server.log.read_text()
    assert "VLLM_TYPED_DECISIONS_BACKEND" in log and "speed" in log
