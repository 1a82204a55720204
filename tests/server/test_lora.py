"""LoRA adapters on a real ``vllm serve --enable-lora`` on CPU (adapters.py, docs/lora.md): a random rank-8
adapter over tiny-qwen2-random's q_proj and v_proj, built in milliseconds (tools/env/build_lora_adapter.py).

One server for the file (and one ``vllm run-batch``, loading the server's saved calibrations): the base model and the adapter answer the same question differently, each with
its own startup check and calibration record; a model it doesn't serve gets vLLM's own 404 in each wire's
shape; an adapter loaded at run time answers 503 until its own startup work is done, then through itself,
and is dropped when unloaded. Calibration reads 60 questions once per model (letters, debias and prior
off), so startup takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import httpx
import pytest

from tools.env import build_lora_adapter
from vllm.entrypoints.generate.decisions.runtime.adapters import weights_sha256

from ..conftest import engine_binding, model_path
from .conftest import VllmServer, running

BASE = "tiny"
QUESTION = {
    "input": "Ticket: My payouts have been failing for 3 days.",
    "questions": [
        {
            "type": "choice",
            "name": "team",
            "instructions": "Which team should handle this?",
            "choices": [
                {"value": "billing"},
                {"value": "technical"},
                {"value": "sales"},
            ],
        },
    ],
}


def build_adapter(out: Path, seed: int) -> Path:
    return build_lora_adapter.build(model_path("tiny-qwen2-random"), out, seed=seed)


def decide(
    server: VllmServer,
    model: str,
    path: str = "/v1/decisions",
    body: dict | None = None,
) -> httpx.Response:
    return httpx.post(
        server.url + path, json={**(body or QUESTION), "model": model}, timeout=60
    )


def ready(server: VllmServer, model: str) -> bool:
    return decide(server, model).status_code == 200


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lora-calibration")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("adapters")
    build_adapter(folder / "judge", seed=0)
    build_adapter(folder / "late", seed=1)
    return folder


@pytest.fixture(scope="module")
def env(tmp_path_factory, saved) -> dict[str, str]:
    """Decisions with the self-check off (random weights) and a 60-question calibration read once per model."""
    questions = tmp_path_factory.mktemp("lora-questions") / "questions.jsonl"
    bundled = resources.files(
        "vllm.entrypoints.generate.decisions.calibration"
    ).joinpath("bundled.jsonl")
    questions.write_text("\n".join(bundled.read_text().splitlines()[-60:]) + "\n")
    return {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit:labels=letters,logprobs=exact",
        "VLLM_TYPED_DECISIONS_DEBIAS": "off",
        "VLLM_TYPED_DECISIONS_PRIOR": "off",
        "VLLM_TYPED_DECISIONS_CALIBRATION": str(questions),
        "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(saved),
        "VLLM_SKIP_MODEL_NAME_VALIDATION": "0",
    }


def lora_args(adapters: Path) -> list[str]:
    return [
        "--served-model-name",
        BASE,
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--max-loras",
        "2",
        "--lora-modules",
        f"judge={adapters / 'judge'}",
    ]


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, adapters, env) -> VllmServer:
    log = tmp_path_factory.mktemp("lora") / "vllm-serve.log"
    with running(
        "tiny-qwen2-random",
        log,
        {**env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
        *lora_args(adapters),
        ready=lambda s: ready(s, BASE) and ready(s, "judge"),
    ) as instance:
        yield instance


def logits(response: httpx.Response) -> dict[str, float]:
    assert response.status_code == 200, response.text
    return response.json()["answers"][0]["extra"]["backend"]["option_logits"]


def test_base_and_adapter_answer_differently_each_with_its_own_calibration(
    lora_server, adapters, saved
):
    base, judge = decide(lora_server, BASE), decide(lora_server, "judge")
    assert base.json()["model"] == BASE and judge.json()["model"] == "judge"
    difference = max(abs(logits(base)[k] - logits(judge)[k]) for k in logits(base))
    assert difference > 0.1, (logits(base), logits(judge))
    audit = judge.json()["answers"][0]["extra"]["audit"]
    assert audit["adapter"] == "judge" and audit["served_model"] == "judge"
    assert "adapter" not in base.json()["answers"][0]["extra"]["audit"]
    # The same question on Jev's wire reads through the same adapter.
    jev = {
        "state": QUESTION["input"],
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": {"billing": None, "technical": None, "sales": None},
            }
        },
    }
    jev_judge = decide(lora_server, "judge", "/v1/systemone", jev).json()
    assert jev_judge["model"] == "judge"
    assert jev_judge["answers"]["team"]["extra"]["backend"][
        "option_logits"
    ] == pytest.approx(logits(judge), abs=1e-4)
    # A startup check and a calibration record each, keyed by the adapter's weights (not its name).
    for kind in ("startup", "calibration"):
        keys = [json.loads(p.read_text())["key"] for p in saved.glob(f"{kind}-*.json")]
        assert sorted("adapter_sha256" in k for k in keys) == [False, True], keys
        (own,) = [k for k in keys if "adapter_sha256" in k]
        assert (
            own["adapter_sha256"] == weights_sha256(str(adapters / "judge"))
            and "adapter" not in own
        )
    assert audit["temperature_source"] in ("calibrated", "default")


def test_an_unknown_model_gets_vllms_404_in_each_wires_shape(lora_server):
    completion = httpx.post(
        f"{lora_server.url}/v1/completions",
        json={"model": "nope", "prompt": "x"},
        timeout=30,
    )
    assert completion.status_code == 404
    refused = decide(lora_server, "nope")
    assert refused.status_code == 404 and refused.json() == completion.json(), (
        "vLLM's own error body"
    )
    jev = decide(
        lora_server,
        "nope",
        "/v1/systemone",
        {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}},
    )
    assert jev.status_code == 404
    assert jev.json()["detail"] == {
        "error_type": "not_found_error",
        "message": completion.json()["error"]["message"],
    }


def test_an_adapter_loaded_at_run_time_starts_on_its_first_request_and_goes_when_unloaded(
    lora_server, adapters, saved
):
    load = {"lora_name": "late", "lora_path": str(adapters / "late")}
    assert (
        httpx.post(
            f"{lora_server.url}/v1/load_lora_adapter", json=load, timeout=60
        ).status_code
        == 200
    )
    first = decide(lora_server, "late")
    assert first.status_code == 503 and first.headers["Retry-After"], first.text
    assert "decisions are starting" in first.json()["error"]["message"]
    assert decide(lora_server, BASE).status_code == 200, "only that adapter waits"
    deadline = time.monotonic() + 120
    while (
        answer := decide(lora_server, "late")
    ).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert answer.status_code == 200, answer.text
    assert logits(answer) != pytest.approx(
        logits(decide(lora_server, "judge")), abs=0.05
    )
    late = weights_sha256(str(adapters / "late"))
    assert any(
        json.loads(p.read_text())["key"].get("adapter_sha256") == late
        for p in saved.glob("calibration-*.json")
    )
    metrics = httpx.get(f"{lora_server.url}/metrics", timeout=30).text
    assert 'adapter="late"' in metrics and 'adapter="judge"' in metrics
    # Another name for the same folder is the same adapter: it answers on its first request, from the
    # service "late" started (a service of its own would answer 503 while it starts).
    alias = {"lora_name": "late-alias", "lora_path": f"{adapters / 'late'}/."}
    loaded = httpx.post(
        f"{lora_server.url}/v1/load_lora_adapter", json=alias, timeout=60
    )
    assert loaded.status_code == 200, loaded.text
    again = decide(lora_server, "late-alias")
    assert again.status_code == 200, again.text
    assert logits(again) == pytest.approx(logits(answer), abs=1e-4)
    for name in ("late-alias", "late"):
        unload = httpx.post(
            f"{lora_server.url}/v1/unload_lora_adapter",
            json={"lora_name": name},
            timeout=60,
        )
        assert unload.status_code == 200
    assert decide(lora_server, "late").status_code == 404
    assert (
        "decisions through LoRA adapter 'late' dropped: it is unloaded"
        in lora_server.log.read_text()
    )


def test_run_batch_lines_read_through_the_adapter_they_name(
    lora_server, adapters, env, tmp_path
):
    """After the server's tests: run-batch loads their saved calibrations, so it starts in seconds."""
    lines = [
        {
            "custom_id": model,
            "method": "POST",
            "url": "/v1/decisions",
            "body": {**QUESTION, "model": model},
        }
        for model in (BASE, "judge", "nope")
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "run-batch",
        "-i",
        str(source),
        "-o",
        str(target),
        "--model",
        str(model_path("tiny-qwen2-random")),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        *lora_args(adapters),
    ]
    quiet = {
        "HF_HUB_OFFLINE": "1",
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLLM_TYPED")},
        **quiet,
        **env,
        **engine_binding(1),
    }
    log = tmp_path / "run-batch.log"
    with log.open("w") as out:
        assert (
            # 3: every line answered, one ("nope") with an error (bulk/run_batch.py FAILED_LINES_EXIT).
            subprocess.run(
                command, env=full_env, stdout=out, stderr=subprocess.STDOUT, timeout=600
            ).returncode
            == 3
        ), log.read_text()[-3000:]
    results = {
        r["custom_id"]: r["response"]
        for r in map(json.loads, target.read_text().splitlines())
    }
    assert results["nope"]["status_code"] == 404
    assert results["nope"]["body"]["error"]["message"].startswith(
        "The model `nope` does not exist."
    )
    online = {model: logits(decide(lora_server, model)) for model in (BASE, "judge")}
    for model in (BASE, "judge"):
        assert results[model]["status_code"] == 200, results[model]
        read = results[model]["body"]["answers"][0]["extra"]["backend"]["option_logits"]
        assert read == pytest.approx(online[model], abs=1e-3), model
    assert "loaded from a saved result" in log.read_text()
