"""Decisions under vLLM's own scale-out, on real servers: two API-server processes in front of one
engine (both serve both endpoints, the startup check and the calibration are done once and shared,
a restart loads the saved calibration in both), and two engine replicas (data parallelism), where the
reads about one state all go to one replica."""

from __future__ import annotations

import hashlib
import re
import time

import httpx
import pytest

from .conftest import VllmServer, answered, running

TINY_ENV = {"VLLM_ENABLE_TYPED_DECISIONS": "1", "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
            "VLLM_TYPED_DECISIONS_BACKEND": "logit"}  # fmt: skip
OPENAI = {"model": "m", "input": "Ticket: my payouts failed for three days and I need the money today.",
          "questions": [{"type": "predicate", "instructions": "Is this urgent?"},
                        {"type": "choice", "instructions": "Which team?",
                         "choices": [{"value": "billing"}, {"value": "technical"}]}]}  # fmt: skip
JEV = {"state": OPENAI["input"], "questions": {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}}


def workers_serving(log: str, path: str) -> set[str]:
    """The API-server processes whose access log shows a 200 for ``path``."""
    return set(re.findall(rf"\((ApiServer_\d+) pid=\d+\) INFO: .*\"POST {re.escape(path)} HTTP/1.1\" 200", log))


@pytest.fixture(scope="module")
def calibration_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("scale-out-calibration")


@pytest.fixture(scope="module")
def two_api_servers(tmp_path_factory, calibration_dir):
    """SmolLM2 behind two API-server processes, calibrating at startup (the bundled set) into a fresh folder."""
    log = tmp_path_factory.mktemp("api-servers") / "vllm-serve.log"
    env = {"VLLM_ENABLE_TYPED_DECISIONS": "1", "VLLM_TYPED_DECISIONS_CALIBRATION": "on",
           "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(calibration_dir)}  # fmt: skip
    with running("smollm2-135m-instruct", log, env, "--api-server-count", "2", ready=all_workers_ready) as server:
        yield server


def all_workers_ready(server: VllmServer) -> bool:
    """Both API-server processes have finished their decision startup work."""
    ready = re.findall(r"\((ApiServer_\d+) pid=\d+\) INFO .*decisions ready:", server.log.read_text(errors="replace"))
    return set(ready) == {"ApiServer_0", "ApiServer_1"}


def test_both_workers_answer_both_endpoints_alike(two_api_servers):
    probabilities = set()
    for _ in range(12):  # a new connection each time: the kernel spreads them over both workers
        answer = answered(two_api_servers, "/v1/decisions", OPENAI)["answers"][0]
        probabilities.add(answer["probability"])
        answered(two_api_servers, "/v1/systemone", JEV)
    log = two_api_servers.log.read_text(errors="replace")
    assert (
        workers_serving(log, "/v1/decisions") == workers_serving(log, "/v1/systemone") == {"ApiServer_0", "ApiServer_1"}
    )
    # One engine answers for both; in bf16 a read over cached prefix blocks differs from a fresh one by a
    # little (README, What the numbers mean), so equal means within that.
    assert max(probabilities) - min(probabilities) < 0.05, f"the workers answered differently: {probabilities}"


def test_startup_work_is_done_once_and_shared(two_api_servers, calibration_dir):
    log = two_api_servers.log.read_text(errors="replace")
    assert log.count("decision calibration saved to") == 1
    assert len(re.findall(r"decision calibration: T=\S+ .*, \d+ s\)", log)) == 1  # measured once
    assert log.count("loaded from a saved result)") == 1  # the other worker loaded it
    assert log.count("decision startup check: adopting the result of another API-server process") == 1
    assert log.count("decision answer slot: option mass") == 2  # both workers run with the result
    assert len(list(calibration_dir.glob("calibration-*.json"))) == 1


def test_a_restart_loads_the_saved_calibration_in_every_worker(two_api_servers, calibration_dir, tmp_path):
    two_api_servers.stop()  # the module's server has done its part; this test starts the next one
    env = {"VLLM_ENABLE_TYPED_DECISIONS": "1", "VLLM_TYPED_DECISIONS_CALIBRATION": "on",
           "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(calibration_dir)}  # fmt: skip
    with running("smollm2-135m-instruct", tmp_path / "restart.log", env, "--api-server-count", "2",
                 ready=all_workers_ready) as restarted:  # fmt: skip
        log = restarted.log.read_text(errors="replace")
        assert log.count("loaded from a saved result)") == 2 and "decision calibration saved to" not in log
        assert answered(restarted, "/v1/decisions", OPENAI)["answers"][0]["type"] == "predicate"


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    log = tmp_path_factory.mktemp("data-parallel") / "vllm-serve.log"
    env = {**TINY_ENV, "VLLM_TYPED_DECISIONS_CALIBRATION": "off"}
    with running("tiny-qwen2-random", log, env, "--dtype", "float32", "--data-parallel-size", "2",
                 ready=all_workers_ready) as server:  # fmt: skip
        yield server


def successes(server: VllmServer) -> dict[str, float]:
    """Finished engine requests per replica, from vLLM's own metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    counts: dict[str, float] = {}
    for engine, value in re.findall(r'^vllm:request_success_total\{engine="(\d+)",[^}]*\} (\S+)$', text, re.M):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts


def test_reads_about_one_state_go_to_one_replica(two_replicas):
    seen = set()
    for i in range(4):
        state = f"Report {i}: " + " ".join(["the river rose over the stone road"] * 40)
        body = {"model": "m", "input": state,
                "questions": [{"type": "predicate", "instructions": f"Is point {q} true?"} for q in range(6)]}  # fmt: skip
        before = successes(two_replicas)
        usage = answered(two_replicas, "/v1/decisions", body)["usage"]
        expected = str(int(hashlib.sha256(state.encode()).hexdigest()[:12], 16) % 2)
        deadline = time.monotonic() + 10
        while (after := successes(two_replicas)) == before and time.monotonic() < deadline:
            time.sleep(0.2)  # the metrics follow the responses
        grew = {engine for engine in after if after[engine] > before.get(engine, 0.0)}
        assert grew == {expected} and after[expected] - before.get(expected, 0.0) == 6
        assert usage["input_tokens_details"]["cached_tokens"] > 0  # reported, and the state was shared
        seen.add(expected)
    assert seen == {"0", "1"}  # different states still use both replicas
