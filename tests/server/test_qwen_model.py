"""Qwen2.5-Coder-0.5B-Instruct on a real ``vllm serve``: a second real instruct model, with Qwen's own ChatML
template, built by tools/env/setup.sh from a GGUF on PyPI (tools/env/convert_gguf.py). Served once for this
file, in float32 like the other test servers, with a 4,096-token context and without startup calibration
(minutes on CPU; test_calibration.py covers it on SmolLM2). The answer-slot self-check runs at its default
minimum option mass (0.5), and decisions answer 200 only once it has passed. Checked: the server is ready
with that self-check passed, both wires read the same probabilities, and most of the next-token mass lands on
the option letters. No accuracy or timing checks.
"""

from __future__ import annotations

import httpx
import pytest

from .conftest import VllmServer, answered, running

MODEL = "qwen2.5-coder-0.5b-instruct"
CONTEXT = 4096
STATE = "Ticket: My payouts have been failing for 3 days and I need the money today."
OPENAI_QUESTIONS = [
    {
        "type": "predicate",
        "name": "urgent",
        "instructions": "Does this ticket convey urgency?",
    },
    {
        "type": "choice",
        "name": "team",
        "instructions": "Which team should handle this?",
        "choices": [
            {"value": "billing", "description": "Payments, refunds"},
            {"value": "technical", "description": "Bugs, outages"},
            {"value": "sales"},
        ],
    },
    {
        "type": "score",
        "name": "frustration",
        "instructions": "How frustrated is the customer?",
        "levels": [{"label": "Calm"}, {"label": "Frustrated"}, {"label": "Very angry"}],
    },
]
# The same three questions in Jev's format: they render to the same prompts.
JEV_QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this ticket convey urgency?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {
            "billing": "Payments, refunds",
            "technical": "Bugs, outages",
            "sales": None,
        },
    },
    "frustration": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Frustrated", "Very angry"],
    },
}


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("qwen") / "vllm-serve.log"
    # logit named explicitly: the example plugin (tests/plugin) would otherwise claim this Qwen2 model.
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit",
        "VLLM_TYPED_DECISIONS_CALIBRATION": "off",
    }
    # A later --max-model-len wins over the one running() passes.
    with running(MODEL, log, env, "--max-model-len", str(CONTEXT)) as instance:
        yield instance


def test_the_self_check_passes_on_qwens_chat_template(qwen_server: VllmServer):
    # running() waited for a decision to answer 200: past the self-check, which otherwise answers 503.
    assert "decisions ready: backend=logit" in qwen_server.log.read_text(
        errors="replace"
    )
    models = httpx.get(qwen_server.url + "/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [
        (qwen_server.model, CONTEXT)
    ]


def test_both_wires_read_the_same_probabilities(qwen_server: VllmServer):
    openai_body = {
        "model": qwen_server.model,
        "input": STATE,
        "questions": OPENAI_QUESTIONS,
    }
    # A first read fills the prefix cache, so the two compared reads see the same cache state (a read over
    # cached blocks and a fresh one may differ in their last digits: docs/wire-formats.md).
    answered(qwen_server, "/v1/decisions", openai_body)
    urgent, team, frustration = answered(qwen_server, "/v1/decisions", openai_body)[
        "answers"
    ]
    jev = answered(
        qwen_server, "/v1/systemone", {"state": STATE, "questions": JEV_QUESTIONS}
    )["answers"]
    assert urgent["probability"] == pytest.approx(jev["urgent"]["noul"], abs=1e-6)
    assert {
        p["value"]: p["probability"] for p in team["probabilities"]
    } == pytest.approx(jev["team"]["probabilities"], abs=1e-6)
    assert [p["probability"] for p in frustration["probabilities"]] == pytest.approx(
        list(jev["frustration"]["probabilities"].values()), abs=1e-6
    )
    assert frustration["score"] == pytest.approx(jev["frustration"]["score"], abs=1e-6)
    for answer in (urgent, team, frustration):
        assert answer["extra"]["audit"]["option_mass"] > 0.5, answer["extra"]["audit"]
