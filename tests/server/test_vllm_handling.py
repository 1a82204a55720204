"""The decision routes take part in vLLM's own request handling: X-Request-Id (echoed, and the prefix of
the engine request ids in vLLM's request log), --enable-server-load-tracking, --api-key answered in each
wire's error shape, and /openapi.json from the protocol models. On the tiny keyed server, which runs
with --enable-log-requests and --enable-server-load-tracking."""

from __future__ import annotations

import re
import threading
import time
import uuid

import httpx

from .conftest import TINY_QWEN_KEY

AUTH = {"Authorization": f"Bearer {TINY_QWEN_KEY}"}
OPENAI = {
    "model": "m",
    "input": "x",
    "questions": [{"type": "predicate", "instructions": "?"}],
}
JEV = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def test_the_clients_request_id_is_echoed_and_names_the_engine_reads(tiny_qwen_server):
    for path, body in (
        ("/v1/decisions", OPENAI),
        ("/v1/systemone", JEV),
        ("/api/alpha/decisions", JEV),
    ):
        request_id = f"trace-{uuid.uuid4().hex[:12]}"
        response = httpx.post(
            tiny_qwen_server.url + path,
            json=body,
            headers={**AUTH, "X-Request-Id": request_id},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"] == request_id
        # the TypeSafe SDK reports this header's id with a failure
        if path != "/v1/decisions":
            assert response.headers["x-typesafe-request-id"] == request_id
        # The response's own id is made from the same one id.
        body_id = (
            response.json()["extra"]["id"]
            if path == "/v1/decisions"
            else response.json()["id"]
        )
        assert (
            body_id
            == ("decisions-" if path == "/v1/decisions" else "systemone-") + request_id
        )
        # vLLM's request log has the engine read under the client's id (question 0).
        deadline = time.monotonic() + 10
        while (
            f"Received request decision-{request_id}-0"
            not in tiny_qwen_server.log.read_text(errors="replace")
        ):
            assert time.monotonic() < deadline, (
                f"no engine read logged for {request_id}"
            )
            time.sleep(0.2)


def test_a_request_without_an_id_gets_one(tiny_qwen_server):
    first, second = (
        httpx.post(
            tiny_qwen_server.url + "/v1/decisions",
            json=OPENAI,
            headers=AUTH,
            timeout=60,
        )
        for _ in range(2)
    )
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]
    # Refusals carry it too.
    refused = httpx.post(
        tiny_qwen_server.url + "/v1/systemone",
        json={"state": "x"},
        headers=AUTH,
        timeout=60,
    )
    assert refused.status_code == 422 and refused.headers["x-request-id"]


def test_a_bad_key_is_refused_in_each_wires_shape(tiny_qwen_server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        openai = httpx.post(
            tiny_qwen_server.url + "/v1/decisions",
            json=OPENAI,
            headers=headers,
            timeout=60,
        )
        assert openai.status_code == 401
        assert (
            openai.json()["error"]["type"] == "UnauthorizedError"
            and openai.json()["error"]["code"] == 401
        )
        for path in ("/v1/systemone", "/api/alpha/decisions"):
            jev = httpx.post(
                tiny_qwen_server.url + path, json=JEV, headers=headers, timeout=60
            )
            assert jev.status_code == 401
            detail = jev.json()["detail"]
            assert (
                detail["error_type"] == "authentication_error"
                and "API key" in detail["message"]
            )
    # vLLM's other routes keep vLLM's own answer.
    assert httpx.get(tiny_qwen_server.url + "/v1/models", timeout=30).status_code == 401


def test_decision_requests_count_in_the_server_load(tiny_qwen_server):
    """vLLM's /load counts requests in flight under --enable-server-load-tracking."""
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=tiny_qwen_server.url, timeout=30) as client:
            while not done.is_set():
                seen.append(client.get("/load").json()["server_load"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        body = {
            "model": "m",
            "input": uuid.uuid4().hex + " the payout is late" * 300,
            "questions": [
                {"type": "predicate", "instructions": f"Question {i}?"}
                for i in range(4)
            ],
        }
        for _ in range(3):
            response = httpx.post(
                tiny_qwen_server.url + "/v1/decisions",
                json=body,
                headers=AUTH,
                timeout=120,
            )
            assert response.status_code == 200, response.text
    finally:
        done.set()
        watcher.join()
    assert max(seen) >= 1, "the decision requests never showed in /load"
    assert (
        httpx.get(tiny_qwen_server.url + "/load", timeout=30).json()["server_load"] == 0
    )
