"""Decisions through Ray Data on a real local Ray cluster (``ray.init(num_cpus=2)``), shared by the tests:
``tools/examples/ray_decide.py`` answers a run-batch file as ``vllm run-batch`` does, with the server's answers,
bad lines in place, and each line once when Ray retries the batches of a killed actor; and the actors
of one stage (bulk/ray_data.py), each with a calibration folder of its own as on separate nodes, do the
startup calibration once between them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
import ray

from vllm.entrypoints.generate.decisions.bulk.ray_data import decisions_stage

from ..conftest import ROOT
from .conftest import TINY_QWEN_KEY
from .test_bulk import (
    ENV,
    FAILED_LINES_EXIT,
    MAX_BODY_BYTES,
    MODEL,
    batch_file,
    by_line,
    input_lines,
    jev_body,
    openai_body,
    probabilities,
)

# Several engines at once (tools/test.sh runs these files in a pass of their own: beside the other tests'
# servers a 24 GiB machine ran out of memory).
pytestmark = pytest.mark.many_engines

TOOL = "tools.examples.ray_decide"  # run as a module from the repository root
# The engine as the test servers run it (conftest.VllmServer), the tiny model's context.
ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "block_size": 32,
    "max_model_len": 2048,
    "enable_prefix_caching": True,
}


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    """A local Ray cluster of two CPUs; its address, for drivers in other processes. Ray's memory monitor
    is off: it counts the whole machine's memory as the cluster's, and on a machine shared with the
    other tests' servers it killed this cluster's actors to free memory they weren't using."""
    monkeypatch_module.setenv("RAY_memory_monitor_refresh_ms", "0")
    context = ray.init(
        num_cpus=2,
        object_store_memory=256 * 2**20,
        include_dashboard=False,
        runtime_env={
            "env_vars": {
                k: v for k, v in ENV.items() if k.startswith(("HF_", "TORCH_"))
            }
        },
    )
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def map_workers() -> list[psutil.Process]:
    """The processes of Ray Data's actors (named ``ray::MapWorker(...)``)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if (process.info["cmdline"] or [""])[0].startswith("ray::MapWorker"):
            found.append(process)
    return found


def test_a_run_batch_file_answered_on_ray_with_an_actor_killed(
    cluster, tiny_qwen_server, tmp_path
):
    source, target, log = (
        tmp_path / "in.jsonl",
        tmp_path / "out.jsonl",
        tmp_path / "ray_decide.log",
    )
    total = len(input_lines(batch_file(source)))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLLM_TYPED")},
        **ENV,
        # small, so the line over it is small too: the driver refuses it unread
        "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    command = [
        sys.executable,
        "-m",
        TOOL,
        "--model",
        str(MODEL),
        "--served-model-name",
        "m",
        "-i",
        str(source),
        "-o",
        str(target),
        "--address",
        cluster,
        "--actors",
        "1",
        "--batch-size",
        "8",
        *(f"--engine-arg={key}={json.dumps(value)}" for key, value in ENGINE.items()),
    ]
    with log.open("w") as out:
        tool = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 600
        while not (target.exists() and target.read_text().count("\n") >= 8):
            assert tool.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no line answered in 600 s"
            time.sleep(0.1)
        (actor,) = map_workers()
        # the actor dies mid-dataset, its engine with it
        actor.send_signal(signal.SIGKILL)
        at_kill = target.read_text().count("\n")
        # Every line answered, some with an error: run-batch's exit status for that.
        assert tool.wait(timeout=600) == FAILED_LINES_EXIT, log.read_text(
            errors="replace"
        )[-3000:]
    finally:
        if tool.poll() is None:
            tool.kill()
    assert at_kill < total  # the kill came while lines were still to be answered

    # each line once: a retried batch's lines are not written twice
    answered = by_line(target)
    assert sorted(answered) == list(range(1, total + 1))
    by_custom_id = {record["custom_id"]: record for record in answered.values()}
    assert (
        answered[21]["error"]["code"] == "invalid_line"
        and answered[21]["response"] is None
    )
    assert by_custom_id["chat"]["error"]["code"] == "unsupported_url"
    refused = by_custom_id["line-7"]["response"]
    assert (
        refused["status_code"] == 400
        and refused["body"]["error"]["type"] == "BadRequestError"
    )
    # /api/alpha/decisions, Jev's error shape
    assert by_custom_id["line-11"]["response"]["status_code"] == 422
    assert "detail" in by_custom_id["line-11"]["response"]["body"]
    # The hostile lines, answered in place (a bad row never fails its batch).
    assert by_custom_id["tiny-t"]["response"]["status_code"] == 400
    assert by_custom_id["tiny-t-jev"]["response"]["status_code"] == 422
    assert "4300 digits" in answered[total - 3]["error"]["message"]
    assert "not valid UTF-8" in answered[total - 2]["error"]["message"]
    over = answered[total]["error"]["message"]
    assert f"over the limit of {MAX_BODY_BYTES}" in over
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in over
    assert "lines in the output failed" in log.read_text(errors="replace")
    for i in range(12, 32):  # the server's answers, both wires
        path, body = (
            ("/v1/decisions", openai_body(i))
            if i % 2
            else ("/v1/systemone", jev_body(i))
        )
        served = httpx.post(
            tiny_qwen_server.url + path,
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {TINY_QWEN_KEY}"},
        )
        record = by_custom_id[f"line-{i}"]
        assert record["response"]["status_code"] == served.status_code == 200, (
            served.text
        )
        assert probabilities(record) == pytest.approx(
            probabilities({"response": {"body": served.json()}}), abs=2e-3
        )


def last_questions(count: int) -> str:
    """The last ``count`` questions of the bundled calibration set (test_calibration.py's choice)."""
    from importlib import resources

    text = (
        resources.files("vllm.entrypoints.generate.decisions.calibration")
        .joinpath("bundled.jsonl")
        .read_text()
    )
    return "\n".join(text.splitlines()[-count:]) + "\n"


def test_the_actors_of_a_stage_check_and_calibrate_once(cluster, tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(last_questions(50))
    settings = {**ENV, "VLLM_TYPED_DECISIONS_CALIBRATION": str(questions)}
    bodies = [
        {"body": json.dumps(openai_body(i)), "url": "/v1/decisions"} for i in range(6)
    ]
    bodies += [
        {"body": json.dumps(jev_body(i)), "url": "/v1/systemone"} for i in range(6)
    ]
    # not JSON: refused in place
    bodies.insert(5, {"body": '{"model": "m", "input": ', "url": "/v1/decisions"})
    stage = decisions_stage(
        str(MODEL),
        ENGINE,
        served_model="m",
        concurrency=2,
        batch_size=2,
        runtime_env={"env_vars": settings},
        # each actor its own calibration folder, as on a node of its own
        actor_env=[
            {"VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / f"node-{k}")}
            for k in range(2)
        ],
    )
    context = ray.data.DataContext.get_current()
    # both actors started, then rows
    waited, context.wait_for_min_actors_s = (
        context.wait_for_min_actors_s,
        600,
    )
    try:
        rows = ray.data.from_items(bodies).map_batches(**stage).take_all()
    finally:
        context.wait_for_min_actors_s = waited

    assert sorted(row["status_code"] for row in rows) == [200] * 12 + [400]
    (bad,) = (row for row in rows if row["status_code"] == 400)
    assert "not valid JSON" in json.loads(bad["response"])["error"]["message"]
    report = ray.get(stage["fn_constructor_kwargs"]["board"].report.remote())
    assert report["actors_started"] == 2
    made = sorted(name.split("-")[0] for name in report["made"])
    assert made == ["calibration", "startup"] and set(report["made"].values()) == {
        1
    }  # each made once
    saved = [
        path.read_text() for path in sorted(tmp_path.glob("node-*/calibration-*.json"))
    ]
    # the one record, in each actor's own folder
    assert len(saved) == 2 and saved[0] == saved[1]
    # The tiny model's answers are noise, so its fit may fail: then both actors apply the default T.
    source = "default" if "failed" in json.loads(saved[0]) else "calibrated"
    for row in rows:
        if row["url"] == "/v1/decisions" and row["status_code"] == 200:
            for answer in json.loads(row["response"])["answers"]:
                assert answer["extra"]["audit"]["temperature_source"] == source
