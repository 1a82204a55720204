"""Hostile clients (issue 38): bodies small on the wire that ask for far more work than their size
(nested JSON rendering to tens of millions of characters, long questions to tokenize) are refused in
each wire's shape, naming the setting to raise, while /health keeps answering within 100 ms: the
work is bounded by the request's budget and runs off the event loop."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

from ..fuzzing import SENTENCE, json_bytes, nested

# The session server allows 16 questions (tests/server/conftest.py), so each body stays within that.
QUESTIONS = 16

# (path, body, status, what the message names)
HOSTILE = [
    (
        "/v1/systemone",
        json_bytes(
            {
                "state": "x",
                "questions": {
                    **{
                        f"q{i}": {
                            "type": "noul",
                            "instructions": nested(500),
                            "criteria": {"true": nested(500)},
                        }
                        for i in range(QUESTIONS - 1)
                    },
                    "last": {"type": "no-such-type"},
                },
            }
        ),
        422,
        "VLLM_TYPED_DECISIONS_MAX_REQUEST_CHARS",
    ),
    (
        "/v1/decisions",
        json_bytes(
            {
                "model": "m",
                "questions": [{"type": "predicate", "instructions": "?"}],
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_json", "data": nested(240)}
                            for _ in range(60)
                        ],
                    }
                ],
            }
        ),
        400,
        "VLLM_TYPED_DECISIONS_MAX_REQUEST_CHARS",
    ),
    (
        "/v1/systemone",
        json_bytes({"state": nested(900), "questions": {"q": {"type": "noul"}}}),
        422,
        "VLLM_TYPED_DECISIONS_MAX_JSON_DEPTH",
    ),
    (
        "/v1/decisions",
        json_bytes(
            {
                "model": "m",
                "input": "x",
                "questions": [
                    {"type": "predicate", "instructions": SENTENCE * 3500}
                    for _ in range(QUESTIONS)
                ],
            }
        ),
        400,
        "--max-model-len 8192",
    ),
    (
        "/v1/systemone",
        json_bytes(
            {
                "state": "x",
                "questions": {
                    f"q{i}": {"type": "noul", "instructions": SENTENCE * 3500}
                    for i in range(QUESTIONS)
                },
            }
        ),
        422,
        "--max-model-len 8192",
    ),
]


def refusal_message(path: str, payload: dict) -> str:
    """The message of a refusal in its wire's shape (the shape itself asserted)."""
    if path == "/v1/decisions":
        error = payload["error"]
        assert error["code"] == 400 and error["type"], payload
        return error["message"]
    (entry,) = payload["detail"]
    assert entry["loc"] == ["body"] and entry["type"], payload
    return entry["msg"]


def test_hostile_bodies_are_refused_while_health_answers_within_100_ms(server):
    results: dict[int, tuple[int, str, float]] = {}

    def send(index: int, path: str, body: bytes) -> None:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            started = time.perf_counter()
            response = client.post(
                path, content=body, headers={"content-type": "application/json"}
            )
            results[index] = (
                response.status_code,
                refusal_message(path, response.json()),
                time.perf_counter() - started,
            )

    senders = [
        threading.Thread(target=send, args=(i, path, body))
        for i, (path, body, _, _) in enumerate(HOSTILE * 2)
    ]
    health: list[float] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        # the connection is open before the hostile bodies
        assert client.get("/health").status_code == 200
        for sender in senders:
            sender.start()
        while any(sender.is_alive() for sender in senders):
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            health.append(time.perf_counter() - started)
            time.sleep(0.02)
    for sender in senders:
        sender.join()
    for i, (path, body, status, named) in enumerate(HOSTILE * 2):
        got, message, _ = results[i]
        assert got == status and named in message, (path, len(body), got, message)
    slowest = max(results.values(), key=lambda result: result[2])
    print(
        f"/health polled {len(health)} times: median {statistics.median(health) * 1000:.1f} ms, "
        f"worst {max(health) * 1000:.1f} ms; slowest refusal {slowest[2]:.2f} s"
    )
    assert len(health) >= 5
    # Within 100 ms: nine polls in ten and the median. The worst polls get more room only for this machine's
    # other processes (2 cores shared by the engine and the other worker's servers). Unbounded work on the
    # event loop stalled it for seconds (issue 38); rendering on many threads kept it waiting for the GIL up
    # to 0.4 s (CI, 2026-12-04); on the one preparing thread the worst of 4 runs here was 30-54 ms. On an
    # AVX2-only CI machine one poll in 169 and one in 177 waited 420 ms, every other under 110 ms (2026-12-07,
    # cause not found: not the parsing thread, see docs/reliability.md), so one poll may take up to 1 s.
    ordered = sorted(health)
    assert ordered[len(ordered) * 9 // 10] < 0.1 and statistics.median(health) < 0.1, (
        ordered[-5:]
    )
    assert ordered[-2] < 0.25 and ordered[-1] < 1.0, ordered[-5:]


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/decisions"])
def test_a_valid_request_after_the_hostile_ones_is_answered(server, path):
    body = (
        {
            "state": {"ticket": nested(3)},
            "questions": {"q": {"type": "noul", "instructions": "Is it urgent?"}},
        }
        if path == "/v1/systemone"
        else {
            "model": "m",
            "input": "x",
            "questions": [{"type": "predicate", "instructions": "Is it urgent?"}],
        }
    )
    response = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text
