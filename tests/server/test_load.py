"""Load: a short soak of mixed traffic with every answer checked, and the engine's queue limit
answered with 503 and Retry-After rather than a hang. (tools/bench/soak.py runs the long soak.)"""

from __future__ import annotations

import asyncio

import httpx

from tools.bench.soak import report, soak

from .conftest import TINY_QWEN_KEY, TINY_QWEN_QUEUE


def test_a_short_soak_serves_everything_well_formed(server):
    tally = asyncio.run(
        soak(
            server.url, seconds=25, concurrency=8, seed=1, server_pid=server.process.pid
        )
    )
    assert tally.served["unexpected"] == 0, report(tally, 25, 8)
    # At least one request through each of the 8 workers; how many more is the machine's speed, not a result.
    assert sum(tally.served[s] for s in (200, 400, 422)) >= 8, report(tally, 25, 8)
    assert tally.served[200] and (tally.served[400] or tally.served[422])


def test_over_the_engine_queue_limit_a_request_gets_503_and_retry_after(
    tiny_qwen_server,
):
    auth = {"Authorization": f"Bearer {TINY_QWEN_KEY}"}
    over = TINY_QWEN_QUEUE + 2
    openai_body = {
        "model": "m",
        "input": "x",
        "questions": [
            {"type": "predicate", "instructions": f"{i}?"} for i in range(over)
        ],
    }
    jev_body = {
        "state": "x",
        "questions": {
            f"q{i}": {"type": "noul", "instructions": f"{i}?"} for i in range(over)
        },
    }
    for path, body in (("/v1/decisions", openai_body), ("/v1/systemone", jev_body)):
        response = httpx.post(
            tiny_qwen_server.url + path, json=body, headers=auth, timeout=60
        )
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "1"
        assert "--max-num-queued-reqs" in response.text
    within = {**openai_body, "questions": openai_body["questions"][:TINY_QWEN_QUEUE]}
    response = httpx.post(
        tiny_qwen_server.url + "/v1/decisions", json=within, headers=auth, timeout=60
    )
    # the refused reads were cancelled, not left queued
    assert response.status_code == 200, response.text
