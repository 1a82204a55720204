"""Decisions under data parallelism on a real server: two engine replicas behind one API-server process,
where the reads about one input all go to one replica. Two API-server processes
in front of one engine are tested with startup calibration (test_calibration.py)."""

from __future__ import annotations

import hashlib
import re
import time

import httpx
import pytest

from ..conftest import engine_binding
from .conftest import VllmServer, answered, running

TINY_ENV = {
    "VLLM_ENABLE_TYPED_DECISIONS": "1",
    "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
    "VLLM_TYPED_DECISIONS_BACKEND": "logit",
    "VLLM_TYPED_DECISIONS_CALIBRATION": "off",
}


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    log = tmp_path_factory.mktemp("data-parallel") / "vllm-serve.log"
    # One API-server process in front of both replicas (vLLM would start one per replica).
    args = ("--data-parallel-size", "2", "--api-server-count", "1")
    with running(
        "tiny-qwen2-random", log, {**TINY_ENV, **engine_binding(replicas=2)}, *args
    ) as server:
        yield server


def successes(server: VllmServer) -> dict[str, float]:
    """Finished engine requests per replica, from vLLM's own metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    counts: dict[str, float] = {}
    for engine, value in re.findall(
        r'^vllm:request_success_total\{engine="(\d+)",[^}]*\} (\S+)$', text, re.M
    ):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts


def test_reads_about_one_state_go_to_one_replica(two_replicas):
    seen = set()
    for i in range(4):
        state = f"Report {i}: " + " ".join(["the river rose over the stone road"] * 40)
        body = {
            "model": "m",
            "input": state,
            "questions": [
                {"type": "predicate", "instructions": f"Is point {q} true?"}
                for q in range(6)
            ],
        }
        before = successes(two_replicas)
        usage = answered(two_replicas, "/v1/decisions", body)["usage"]
        expected = str(int(hashlib.sha256(state.encode()).hexdigest()[:12], 16) % 2)
        deadline = time.monotonic() + 10
        while (
            after := successes(two_replicas)
        ) == before and time.monotonic() < deadline:
            time.sleep(0.2)  # the metrics follow the responses
        grew = {engine for engine in after if after[engine] > before.get(engine, 0.0)}
        # Six questions, one reading each (rotate:1, the default).
        assert grew == {expected} and after[expected] - before.get(expected, 0.0) == 6
        # reported, and the state was shared
        assert usage["input_tokens_details"]["cached_tokens"] > 0
        seen.add(expected)
    assert seen == {"0", "1"}  # different states still use both replicas
