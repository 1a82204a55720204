"""A stop during startup calibration on a real vLLM engine (SmolLM2, CPU): cancelled during the full
calibration, as the end of ``vllm serve``'s event loop cancels it, it logs one INFO line saying so and
no error; the next start answers its first decision on the saved first pass, without reading it
again; and the engine shut down under that start's full calibration, as the server's launcher does
first, again logs one line and no error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..conftest import OVERLAY, engine_binding, model_path

PROBE = Path(__file__).with_name("stop_probe.py")


def stop_lines(log: list[dict]) -> list[dict]:
    """The lines a stop logs, after making sure the package logged no error and no traceback."""
    assert not [r for r in log if r["level"] in ("ERROR", "CRITICAL") or r["traceback"]]
    return [
        r for r in log if " cancelled" in r["message"] or " stopped" in r["message"]
    ]


def test_a_stop_during_calibration_is_one_line_and_a_restart_answers_on_the_first_pass(
    tmp_path,
):
    # SmolLM2's first pass fits on the bundled set's last questions (on its first ones it is near
    # chance, and a first pass there lands at the range's edge and is not applied).
    bundled = OVERLAY / "calibration" / "bundled.jsonl"
    questions = tmp_path / "questions.jsonl"
    questions.write_text("\n".join(bundled.read_text().splitlines()[-260:]) + "\n")
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VLLM_TYPED", "VLLM_ENABLE_TYPED"))
        },
        **engine_binding(1),
        "HF_HUB_OFFLINE": "1",
        "VLLM_TYPED_DECISIONS_CALIBRATION": str(questions),
        "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
        "VLLM_TYPED_DECISIONS_DEBIAS": "off",
    }
    result = subprocess.run(
        [sys.executable, str(PROBE), str(model_path("smollm2-135m-instruct"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = (
        json.loads(result.stdout.strip().splitlines()[-1])[k]
        for k in ("first", "second")
    )

    assert first["stage"] == "first pass"
    (line,) = stop_lines(first["log"])
    assert line["level"] == "INFO"
    assert line["message"].startswith(
        "decision calibration cancelled during the full calibration; its first pass is saved"
    )
    assert len(list((tmp_path / "saved").glob("first-pass-*.json"))) == 1

    assert second["status"] == 200, second["body"]
    audit = second["body"]["answers"][0]["extra"]["audit"]
    assert (audit["calibration_stage"], audit["calibration_reads"]) == (
        "first pass",
        first["question_reads"],
    )
    messages = [r["message"] for r in second["log"]]
    assert any(
        m.startswith("decision first-pass calibration: T=")
        and m.endswith("loaded from a saved result)")
        for m in messages
    )
    assert not [m for m in messages if "reading a first pass" in m]
    (line,) = stop_lines(second["log"])
    assert line["level"] == "INFO"
    assert " during the full calibration; its first pass is saved" in line["message"]
