"""A client that disconnects mid-request leaves no engine work running: single-question,
multi-question and two-stage requests, on both endpoints.

vLLM counts finished requests (``vllm:request_success_total``) and their prompt tokens when they
finish; an aborted read adds to neither. So after a disconnect both counters must stop moving, and
fall short of what the whole request would have added (the completed control shows how much that is).
"""

from __future__ import annotations

import re
import time
import uuid

import httpx
import pytest

from .conftest import VllmServer


def finished(server: VllmServer) -> tuple[float, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text

    def total(name: str) -> float:
        return sum(
            float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)", text, re.M)
        )

    return total("vllm:request_success_total"), total("vllm:prompt_tokens_total")


def fresh_state(words: int) -> str:
    return f"{uuid.uuid4().hex} " + "the ticket mentions a delayed payout " * (
        words // 6
    )


def openai_body(questions: int, words: int, debias: str = "rotate") -> dict:
    return {
        "model": "m",
        "input": fresh_state(words),
        "extra": {"debias": debias},
        "questions": [
            {"type": "predicate", "instructions": f"Question {i}?"}
            for i in range(questions)
        ],
    }


def two_stage_body(path: str) -> dict:
    choices = [f"team {i}" for i in range(20)]
    if path == "/v1/decisions":
        return {
            "model": "m",
            "input": fresh_state(150),
            "extra": {"backend_options": {"readout": "two-stage"}, "debias": "off"},
            "questions": [
                {
                    "type": "choice",
                    "instructions": "Which team?",
                    "choices": [{"value": c} for c in choices],
                }
            ],
        }
    return {
        "state": fresh_state(150),
        "extra": {"backend_options": {"readout": "two-stage"}, "debias": "off"},
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": dict.fromkeys(choices),
            }
        },
    }


def disconnect(server: VllmServer, path: str, body: dict) -> None:
    # the request must still be running when we leave
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + path, json=body, timeout=0.3)


# (path, body, engine reads of the whole request): "single" reads its question twice (debias rotate,
# the default); the others read once per question so that they finish within the control's time.
CASES = {
    "single": ("/v1/decisions", lambda: openai_body(1, 700), 2),
    "multi": ("/v1/decisions", lambda: openai_body(16, 300, debias="off"), 16),
    "two-stage": ("/v1/decisions", lambda: two_stage_body("/v1/decisions"), 21),
    "two-stage-jev": ("/v1/systemone", lambda: two_stage_body("/v1/systemone"), 21),
}


@pytest.fixture(scope="module")
def whole_request(server) -> dict[str, tuple[float, float]]:
    """The control: each case's whole request on this machine, and how many engine reads it finished.
    A disconnect test waits longer than the whole request would have taken, however fast the machine."""
    measured = {}
    for case, (path, body, _) in CASES.items():
        before = finished(server)
        started = time.monotonic()
        response = httpx.post(server.url + path, json=body(), timeout=600)
        assert response.status_code == 200, response.text
        took = time.monotonic() - started
        time.sleep(0.2)
        measured[case] = (took, finished(server)[0] - before[0])
    return measured


@pytest.mark.parametrize("case", CASES)
def test_a_disconnect_leaves_no_engine_work(server, case, whole_request):
    path, body, reads = CASES[case]
    before = finished(server)
    disconnect(server, path, body())
    time.sleep(0.5)
    at_disconnect = finished(server)
    # longer than the whole request takes here
    time.sleep(max(6.0, 1.5 * whole_request[case][0]))
    later = finished(server)
    assert later == at_disconnect, (
        f"engine work went on after the client left: {at_disconnect} -> {later}"
    )
    assert later[0] - before[0] < reads


@pytest.mark.parametrize("case", CASES)
def test_control_the_same_requests_complete_and_count(whole_request, case):
    assert whole_request[case][1] >= CASES[case][2]
