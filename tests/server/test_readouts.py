"""Each readout and logprob mode of the logit backend against real servers."""

from __future__ import annotations

import httpx
import pytest

from .conftest import TINY_QWEN_KEY, VllmServer, running

STATE = "Ticket: My payouts have been failing for 3 days and I need the money today."


def choice(count, **backend_options):
    # One read per question (debias off): the readouts are what is tested here, rotations in test_quality.py.
    return {
        "model": "m",
        "input": STATE,
        "extra": {"backend_options": backend_options, "debias": "off"},
        "questions": [
            {
                "type": "choice",
                "instructions": "Which city is mentioned?",
                "choices": [{"value": f"city {i}"} for i in range(count)],
            }
        ],
    }


def answer(client, body):
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    (result,) = response.json()["answers"]
    assert result["type"] == "choice", result
    assert sum(p["probability"] for p in result["probabilities"]) == pytest.approx(1.0)
    return result


@pytest.mark.parametrize(
    ("count", "options", "readout", "logprobs", "passes"),
    [
        (4, {"logprobs": "exact"}, "direct", "exact", 1),
        (4, {"logprobs": "top-k"}, "direct", "top-k", 1),
        (40, {"logprobs": "exact"}, "wide-direct", "exact", 1),
        (40, {}, "wide-direct", "top-k", 1),
        (
            5,
            {"readout": "two-stage", "logprobs": "exact", "shortlist": 3},
            "two-stage",
            "exact",
            6,
        ),
        (5, {"readout": "two-stage", "shortlist": 3}, "two-stage", "top-k", 6),
    ],
)
def test_readouts_and_logprob_modes(client, count, options, readout, logprobs, passes):
    result = answer(client, choice(count, **options))
    audit, backend = result["extra"]["audit"], result["extra"]["backend"]
    assert (audit["readout"], backend["logprobs"], audit["forward_passes"]) == (
        readout,
        logprobs,
        passes,
    )
    assert audit["label_layout"] == ("markers" if count <= 26 else "markers+pairs")
    assert len(backend["option_logits"]) == count
    if readout == "two-stage":
        assert len(backend["shortlist"]) == 3 and len(backend["stage1_scores"]) == count


def test_words_answer_alike_on_both_wires(client):
    """labels=words reads a yes/no question's Yes and No (SmolLM2's words pass the startup check), and
    both wires get the same probabilities from it."""
    extra = {"backend_options": {"labels": "words"}}
    openai = client.post(
        "/v1/decisions",
        json={
            "model": "m",
            "input": STATE,
            "extra": extra,
            "questions": [{"type": "predicate", "instructions": "Is this urgent?"}],
        },
    )
    jev = client.post(
        "/v1/systemone",
        json={
            "state": STATE,
            "extra": extra,
            "questions": {
                "urgent": {"type": "noul", "instructions": "Is this urgent?"}
            },
        },
    )
    assert openai.status_code == 200 and jev.status_code == 200, (openai.text, jev.text)
    (by_openai,), by_jev = openai.json()["answers"], jev.json()["answers"]["urgent"]
    assert by_openai["probability"] == pytest.approx(by_jev["noul"], abs=1e-6)
    assert (
        by_openai["extra"]["audit"]["label_layout"]
        == by_jev["extra"]["audit"]["label_layout"]
        == "words"
    )
    assert by_openai["extra"]["audit"]["option_mass"] > 0.5
    letters = client.post(
        "/v1/decisions",
        json={
            "model": "m",
            "input": STATE,
            "questions": [{"type": "predicate", "instructions": "Is this urgent?"}],
        },
    ).json()["answers"][0]
    assert letters["extra"]["audit"]["label_layout"] == "markers"


def test_the_startup_log_gives_both_layouts_option_mass(server: VllmServer):
    line = next(
        line
        for line in server.log.read_text().splitlines()
        if "decision prompt: " in line
    )
    letters = float(line.split("option mass ")[1].split(" ")[0])
    words = float(line.split("words option mass ")[1].split(" ")[0].rstrip(","))
    assert letters >= 0.5 and words >= 0.5, line


def test_top_k_floors_options_outside_the_window(client):
    result = answer(client, choice(26))  # default window: --max-logprobs 20
    backend = result["extra"]["backend"]
    assert backend["topk_window"] == 20 and backend["floored"], (
        "26 letters can't all be in a 20-wide window"
    )
    floor = min(backend["option_logits"].values())
    floored_keys = {f'"city {ord(label) - ord("A")}"' for label in backend["floored"]}
    assert all(backend["option_logits"][k] == floor for k in floored_keys)
    assert result["extra"]["audit"]["option_mass"] < 1.0


def test_explicit_exact_read_past_the_token_id_cap_is_refused(client):
    response = client.post(
        "/v1/decisions", json=choice(200, readout="wide-direct", logprobs="exact")
    )
    assert response.status_code == 400
    assert "MAX_LOGPROB_TOKEN_IDS" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def qwen(tiny_qwen_server):
    with httpx.Client(
        base_url=tiny_qwen_server.url,
        timeout=300,
        headers={"Authorization": f"Bearer {TINY_QWEN_KEY}"},
    ) as http:
        yield http


@pytest.mark.parametrize("logprobs", ["top-k", "exact"])
def test_255_options_in_one_pass_on_qwens_tokenizer(qwen, logprobs):
    result = answer(qwen, choice(255, logprobs=logprobs))
    audit, backend = result["extra"]["audit"], result["extra"]["backend"]
    assert audit["readout"] == "wide-direct" and audit["forward_passes"] == 1
    # 255 labels are past the engine's 128 token-id cap: auto reads them top-k.
    assert backend["logprobs"] == "top-k"


@pytest.fixture(scope="module")
def local_bpe(tmp_path_factory):
    """A tiny model whose small tokenizer keeps few letter pairs whole: wide-direct can't hold 255."""
    log = tmp_path_factory.mktemp("tiny-llama") / "vllm-serve.log"
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
    }
    with (
        running("tiny-llama-localtok", log, env) as instance,
        httpx.Client(base_url=instance.url, timeout=600) as http,
    ):
        yield instance, http


def test_two_stage_where_wide_direct_cannot_hold_the_options(local_bpe):
    server, http = local_bpe
    capacity = int(
        server.log.read_text().split("top-k wide-direct up to ")[1].split(",")[0]
    )
    assert capacity < 255
    result = answer(http, choice(255))
    audit = result["extra"]["audit"]
    assert audit["readout"] == "two-stage" and audit["forward_passes"] == 256
    assert len(result["extra"]["backend"]["shortlist"]) == 8


def test_the_startup_log_says_what_fits(server: VllmServer):
    line = next(
        line
        for line in server.log.read_text().splitlines()
        if "decision readouts:" in line
    )
    assert (
        "direct up to 26" in line
        and "two-stage beyond" in line
        and "token-id cap=128" in line
    )
