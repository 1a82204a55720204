"""The Python API (``bulk.Decisions``) over an engine held in process: ``tools/examples/decide_in_process.py``,
the documented example, run as a user would on the tiny Qwen model. Both wires answer as the server
does, a broken request gets the server's error body, and ``decide_many`` yields in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ..conftest import ROOT, model_path

EXAMPLE = "tools.examples.decide_in_process"  # run as a module from the repository root


def test_the_documented_example_decides_in_process():
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VLLM_TYPED", "VLLM_ENABLE_TYPED"))
        },
        "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit",
        "VLLM_TYPED_DECISIONS_CALIBRATION": "off",
        "HF_HUB_OFFLINE": "1",
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            EXAMPLE,
            str(model_path("tiny-qwen2-random")),
            "--dtype",
            "float32",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = [
        json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")
    ]
    (openai,), (jev,), (refused,), *many = (list(p.values()) for p in printed)
    status, body = openai
    assert status == 200 and 0 < body["answers"][0]["probability"] < 1
    assert body["answers"][0]["extra"]["backend"]["name"] == "logit"
    status, body = jev
    assert status == 200 and set(body["answers"]["team"]["probabilities"]) == {
        "billing",
        "tech",
    }
    status, body = refused
    assert (
        status == 400
        and body["error"]["type"] == "BadRequestError"
        and "questions" in body["error"]["message"]
    )
    assert [m[0][0] for m in many] == [200, 200, 200]
    assert all(0 < m[0][1] < 1 for m in many)
