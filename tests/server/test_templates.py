"""Three families of the template matrix on a real ``vllm serve`` each (tests/templates): one whose
template opens a reasoning block (DeepSeek-R1 distill), one that refuses a system role (Gemma 2), and
GPT-OSS's harmony format; and a model with no chat template at all (a base model). Tiny random-weight
checkpoints, so the answer-slot self-check's threshold is 0 (random weights put no mass on the letters);
what is checked is that the server says how the decision prompt meets the template, answers both wires,
and reads a prompt of exactly the length pinned at the tokenizer level (tests/unit/test_template_matrix.py), or,
without a template, refuses with what to pass. The four start side by side to save suite time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

import vllm

from ..templates.families import BY_NAME
from ..templates.matrix import family_path
from ..unit.test_template_matrix import pinned_prompts
from .conftest import VllmServer, decisions_ready

SERVED = {
    "deepseek-r1": "answer slot: closes the template's open ending with '</think>\\n', then 'Answer:'",
    "gemma2": "instructions in the head of the user turn (the chat template has no system role)",
    "gpt-oss": "answer slot: closes the template's open ending with '<|channel|>final<|message|>', then 'Answer:'",
}
# On vLLM 0.32 (tools/test.sh's second pass) one family, to show the template handling holds there too.
ON_VLLM_030 = vllm.__version__.startswith("0.30.")
if not ON_VLLM_030:
    SERVED = {"gemma2": SERVED["gemma2"]}
pytestmark = pytest.mark.vllm032
TEAM = {
    "type": "choice",
    "instructions": "Which team?",
    "choices": [
        {"value": v}
        for v in ("billing", "tech", "sales", "shipping", "account", "other")
    ],
}
# The first self-check probe as a request: its prompt is the one pinned for each family.
PROBE = {
    "input": "The sky is blue and the sun is shining.",
    "extra": {"debias": "off"},
    "questions": [{"type": "predicate", "instructions": "Is the sun shining?"}],
}


def base_model(folder: Path) -> Path:
    """A copy of a family's checkpoint without its chat template, as a base model comes."""
    model = folder / "base-model"
    shutil.copytree(family_path(BY_NAME["granite"]), model)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def startup_refused(server: VllmServer) -> bool:
    return "decisions unavailable on this server" in server.log.read_text(
        errors="replace"
    )


@pytest.fixture(scope="module")
def family_servers(tmp_path_factory):
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit",
    }
    folder = tmp_path_factory.mktemp("templates")
    servers: dict[str, VllmServer] = {}
    try:
        for name in SERVED:
            mode = BY_NAME[name].tokenizer_mode
            # bfloat16, as these models are served: GPT-OSS's attention sinks on CPU take nothing else.
            servers[name] = VllmServer(
                family_path(BY_NAME[name]),
                folder / f"{name}.log",
                env,
                "--tokenizer-mode",
                mode,
                "--served-model-name",
                name,
                dtype="bfloat16",
            )
        if ON_VLLM_030:
            servers["base"] = VllmServer(base_model(folder), folder / "base.log", env)
        for name, server in servers.items():
            server.wait(startup_refused if name == "base" else decisions_ready)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.mark.parametrize("name", SERVED)
def test_the_startup_log_says_how_the_decision_prompt_works(family_servers, name):
    log = family_servers[name].log.read_text(errors="replace")
    line = next(line for line in log.splitlines() if "decision prompt: " in line)
    assert SERVED[name] in line, line
    assert "decisions ready" in log


@pytest.mark.parametrize("name", SERVED)
def test_both_wires_answer_the_same_question_alike(family_servers, name):
    url = family_servers[name].url
    criteria = {"billing": None, "tech": None, "sales": None}
    openai = httpx.post(
        f"{url}/v1/decisions",
        timeout=120,
        json={
            "model": name,
            "input": "Card charged twice!",
            "extra": {"debias": "off"},
            "questions": [
                {
                    "type": "choice",
                    "instructions": "Which team?",
                    "choices": [{"value": value} for value in criteria],
                }
            ],
        },
    )
    jev = httpx.post(
        f"{url}/v1/systemone",
        timeout=120,
        json={
            "state": "Card charged twice!",
            "extra": {"debias": "off"},
            "questions": {
                "team": {
                    "type": "choice",
                    "instructions": "Which team?",
                    "criteria": criteria,
                }
            },
        },
    )
    assert openai.status_code == 200 and jev.status_code == 200, (openai.text, jev.text)
    by_openai = {
        c["value"]: c["probability"]
        for c in openai.json()["answers"][0]["probabilities"]
    }
    assert by_openai == pytest.approx(
        jev.json()["answers"]["team"]["probabilities"], abs=1e-6
    )
    assert sum(by_openai.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("name", SERVED)
def test_the_engine_reads_the_pinned_prompt(family_servers, name):
    answer = httpx.post(
        f"{family_servers[name].url}/v1/decisions",
        json={"model": name, **PROBE},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["input_tokens"] == pinned_prompts()[name]["tokens"]


# patches/exact-logprobs recomputes through a model's ``lm_head``; vLLM's Gemma 2 reads through its tied
# embedding instead, so its reads keep bf16 and the startup line says why.
FP32_READS = {"deepseek-r1": True, "gemma2": False, "gpt-oss": True}


@pytest.mark.parametrize("name", SERVED)
def test_reads_say_their_precision_under_the_bf16_model(family_servers, name):
    """Reads ask for float32 by default: recomputed under a bf16 model (off the bf16 grid, within a step of
    the model-precision read), or, where the LM head can't be recomputed, in bf16 and said so."""
    url = family_servers[name].url
    reads = {}
    for precision in ("float32", "model"):
        body = {
            "model": name,
            "input": "Card charged twice!",
            "questions": [TEAM],
            "extra": {"debias": "off", "backend_options": {"precision": precision}},
        }
        response = httpx.post(f"{url}/v1/decisions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        answer = response.json()["answers"][0]["extra"]
        exact = precision == "float32" and FP32_READS[name]
        assert answer["audit"]["logit_precision"] == (
            "float32" if exact else "bfloat16"
        )
        reads[precision] = list(answer["backend"]["option_logits"].values())
    log = family_servers[name].log.read_text(errors="replace")
    if FP32_READS[name]:
        assert reads["float32"] != reads["model"] and reads["float32"] == pytest.approx(
            reads["model"], abs=0.1
        )
        assert (
            "option log-probabilities in float32, recomputed from the bfloat16 model"
            in log
        )
    else:
        assert reads["float32"] == reads["model"]
        assert (
            "option log-probabilities in bfloat16, the LM head's dtype: the engine returned"
            in log
        )


@pytest.mark.skipif(
    not ON_VLLM_030, reason="on vLLM 0.32 one family only (tools/test.sh)"
)
def test_a_model_without_a_chat_template_is_refused_with_what_to_pass(family_servers):
    server = family_servers["base"]
    bodies = {
        "/v1/decisions": {
            "model": "m",
            "input": "x",
            "questions": [{"type": "predicate", "instructions": "x?"}],
        },
        "/v1/systemone": {
            "state": "x",
            "questions": {"q": {"type": "noul", "instructions": "x?"}},
        },
    }
    for path, body in bodies.items():
        refused = httpx.post(server.url + path, json=body, timeout=60)
        assert refused.status_code == 503, refused.text
        assert "--chat-template" in refused.text
        # waiting won't help: the server needs a template
        assert "retry-after" not in refused.headers
    log = server.log.read_text(errors="replace")
    assert "--chat-template" in log and "Traceback" not in log
    # vLLM itself serves on
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
