"""The encoder backend on a real server: a tiny Laya checkpoint served as LayaForDecision, the backend
chosen by architecture, every type it supports on both endpoints, the rest refused per question, and
the numbers equal to the plain-PyTorch reference of the same prompt."""

from __future__ import annotations

import httpx
import openai
import pytest
import typesafe_sdk
from openai.types import Decision

from vllm.entrypoints.generate.decisions.decide.backends.encoder import laya_prompts

from ..conftest import model_path
from ..laya_reference import reference_outputs
from .conftest import answered, running

STATE = "The parcel arrived broken and two weeks late."
JEV = {
    "state": STATE,
    "questions": {
        "unhappy": {
            "type": "noul",
            "instructions": "Is the customer unhappy?",
            "criteria": {"true": "they complain"},
        },
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "money", "shipping": None},
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent?",
            "criteria": ["not", "somewhat", "very"],
        },
        "mood": {"type": "sentiment"},
    },
}
OPENAI = {
    "model": "m",
    "input": STATE,
    "questions": [
        {"type": "predicate", "instructions": "Is the customer unhappy?"},
        {
            "type": "choice",
            "instructions": "Which team?",
            "choices": [{"value": "billing"}, {"value": "shipping"}],
        },
        {
            "type": "score",
            "instructions": "How urgent?",
            "levels": [{"label": "not"}, {"label": "somewhat"}, {"label": "very"}],
        },
        {"type": "sentiment", "name": "mood"},
    ],
}


@pytest.fixture(scope="module")
def laya_server(tmp_path_factory):
    """fp32, so the served numbers can be compared with the reference; the checkpoint's own prompt
    builder runs because the server trusts its code."""
    log = tmp_path_factory.mktemp("laya") / "vllm-serve.log"
    env = {"VLLM_ENABLE_TYPED_DECISIONS": "1"}
    # An encoder-only model keeps no KV cache: vLLM refuses prefix caching for it (off by default).
    args = (
        "--max-model-len",
        "1024",
        "--trust-remote-code",
        "--no-enable-prefix-caching",
    )
    with running("tiny-laya", log, env, *args) as instance:
        yield instance


def test_the_encoder_backend_is_chosen_for_a_laya_checkpoint(laya_server):
    log = laya_server.log.read_text()
    assert "backend encoder (chosen for the model)" in log
    assert "encoder backend: Laya prompts laya-v1 (checkpoint)" in log


def test_jev_answers_noul_choice_and_score_and_refuses_the_rest(laya_server):
    body = answered(laya_server, "/v1/systemone", {**JEV, "extra": {"detail": "full"}})
    answers = body["answers"]
    assert set(answers) == {"unhappy", "team", "urgency"}
    assert 0 < answers["unhappy"]["noul"] < 1
    assert answers["team"]["choice"] in ("billing", "shipping")
    assert 0 <= answers["urgency"]["score"] <= 2
    for answer in answers.values():
        backend = answer["extra"]["backend"]
        assert backend["name"] == "encoder" and backend["prompt_source"] == "checkpoint"
        assert len(backend["act_scores"]) == 3
    assert (
        "the encoder backend answers choice, noul, score questions; 'sentiment'"
        in body["partial_failures"]["mood"]
    )


def test_openai_answers_predicate_choice_and_score_and_refuses_the_rest(laya_server):
    predicate, choice, score, mood = answered(laya_server, "/v1/decisions", OPENAI)[
        "answers"
    ]
    assert predicate["type"] == "predicate" and 0 < predicate["probability"] < 1
    assert choice["type"] == "choice" and choice["choice"] in ("billing", "shipping")
    assert score["type"] == "score"
    assert (
        mood["type"] == "refusal"
        and "'sentiment' is not one of them" in mood["extra"]["error"]
    )


def test_the_openai_sdk_reads_encoder_answers(laya_server):
    client = openai.OpenAI(
        base_url=f"{laya_server.url}/v1", api_key="unused", max_retries=0
    )
    decision = client.decisions.create(
        model="m", input=STATE, questions=OPENAI["questions"][:3]
    )
    assert isinstance(decision, Decision) and len(decision.answers) == 3


def test_the_typesafe_sdk_reads_encoder_answers(laya_server):
    client = typesafe_sdk.TypeSafeClient(api_key="unused", base_url=laya_server.url)
    questions = {
        "late": typesafe_sdk.Noul(instructions="Late?"),
        "level": typesafe_sdk.Score(instructions="Mood?", criteria=["Calm", "Angry"]),
    }
    response = client.system_one(STATE, questions)
    assert 0 < response.answers["late"].noul < 1 and set(
        response.answers["level"].probabilities
    ) == {0, 1}


def test_served_scores_are_the_reference_model_on_the_same_prompt(laya_server):
    from transformers import AutoTokenizer

    folder = model_path("tiny-laya")
    body = {
        **JEV,
        "extra": {"detail": "full", "debias": "off"},
    }  # one read, as the reference makes
    answer = answered(laya_server, "/v1/systemone", body)["answers"]["unhappy"]
    ids, _ = laya_prompts.build_prompt(
        AutoTokenizer.from_pretrained(folder),
        STATE,
        "noul",
        "Is the customer unhappy?",
        ["false: no, the statement does not hold", "true: they complain"],
        max_len=512,
        head_max_len=192,
        option_max_tokens=48,
    )
    expected = reference_outputs(folder, ids)
    logits = answer["extra"]["backend"]["option_logits"]
    assert [logits["false"], logits["true"]] == pytest.approx(expected[:2], abs=1e-4)
    assert answer["extra"]["backend"]["act_scores"] == pytest.approx(
        expected[2:], abs=1e-4
    )


def test_the_same_question_gets_the_same_probabilities_on_both_endpoints(laya_server):
    jev = answered(
        laya_server,
        "/v1/systemone",
        {"state": STATE, "questions": {"q": {"type": "noul", "instructions": "Late?"}}},
    )
    oai = answered(
        laya_server,
        "/v1/decisions",
        {
            "model": "m",
            "input": STATE,
            "questions": [{"type": "predicate", "instructions": "Late?"}],
        },
    )
    assert jev["answers"]["q"]["noul"] == pytest.approx(
        oai["answers"][0]["probability"], abs=1e-6
    )


def test_an_input_longer_than_the_checkpoint_reads_is_refused_not_cut(laya_server):
    response = httpx.post(
        laya_server.url + "/v1/decisions",
        json={**OPENAI, "input": "late " * 700},
        timeout=120,
    )
    assert response.status_code == 400, response.text
    assert "(laya_config.max_len = 512)" in response.text
