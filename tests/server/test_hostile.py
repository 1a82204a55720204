"""Hostile requests on a real server (the tiny Qwen session server): only real numbers leave it, every
refusal has the status that says whether retrying can help, in the wire's own shape, and no response
holds a local path or an exception's text (docs/reliability.md)."""

from __future__ import annotations

import math
import socket
import time

import httpx
import pytest

from ..conftest import model_path
from .conftest import TINY_QWEN_KEY, VllmServer
from .test_metrics import decision_samples, total

AUTH = {"Authorization": f"Bearer {TINY_QWEN_KEY}"}
OPENAI = {
    "model": "m",
    "input": "The parcel is late.",
    "questions": [
        {"type": "predicate", "instructions": "Late?"},
        {
            "type": "choice",
            "instructions": "Which team?",
            "choices": [{"value": "billing"}, {"value": "shipping"}],
        },
    ],
}
JEV = {
    "state": "The parcel is late.",
    "questions": {
        "late": {"type": "noul", "instructions": "Late?"},
        "level": {
            "type": "score",
            "instructions": "How late?",
            "criteria": ["not", "a bit", "very"],
        },
    },
}
WIRES = {
    "/v1/decisions": (OPENAI, 400),
    "/v1/systemone": (JEV, 422),
    "/api/alpha/decisions": (JEV, 422),
}


def post(
    server: VllmServer, path: str, body: dict | None = None, content: str | None = None
) -> httpx.Response:
    return httpx.post(
        server.url + path,
        json=body,
        content=content,
        timeout=120,
        headers={**AUTH, "Content-Type": "application/json"},
    )


def numbers(body: dict) -> list:
    """Every probability, score and confidence of an answer body (either wire), wherever it sits."""
    found, stack = (
        [],
        [
            answer
            for answer in (
                body["answers"].values()
                if isinstance(body["answers"], dict)
                else body["answers"]
            )
        ],
    )
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, value in item.items():
                if key in ("probability", "noul", "score", "confidence"):
                    found.append(value)
                elif key != "extra":
                    stack.append(value)
    return found


@pytest.mark.parametrize("path", WIRES)
@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-9, 1e300])
def test_a_temperature_outside_the_range_is_refused_naming_the_settings(
    tiny_qwen_server, path, temperature
):
    body, status = WIRES[path]
    response = post(
        tiny_qwen_server,
        path,
        {**body, "extra": {"calibration_temperature": temperature}},
    )
    assert response.status_code == status, response.text
    assert (
        "VLLM_TYPED_DECISIONS_MIN_TEMPERATURE" in response.text
        and "calibration_temperature" in response.text
    )


@pytest.mark.parametrize("path", WIRES)
@pytest.mark.parametrize("temperature", [0.001, 1000.0])
def test_the_ends_of_the_range_answer_with_real_numbers(
    tiny_qwen_server, path, temperature
):
    body, _ = WIRES[path]
    response = post(
        tiny_qwen_server,
        path,
        {**body, "extra": {"calibration_temperature": temperature}},
    )
    assert response.status_code == 200, response.text
    found = numbers(response.json())
    assert found and all(
        isinstance(n, int | float) and math.isfinite(n) for n in found
    ), response.text


@pytest.mark.parametrize("path", WIRES)
def test_numbers_no_field_can_take_are_each_wires_validation_error_not_a_server_error(
    tiny_qwen_server, path
):
    body, status = WIRES[path]
    before = decision_samples(tiny_qwen_server)
    huge = post(
        tiny_qwen_server, path, content='{"extra": {"seed": ' + "9" * 5000 + "}}"
    )
    assert huge.status_code == status, huge.text
    assert "4300 digits" in huge.text
    if status == 422:
        assert huge.json()["detail"][0]["loc"] == [
            "body"
        ]  # Jev's own validation shape, not vLLM's
    else:
        assert huge.json()["error"]["type"] == "BadRequestError"
    overflow = post(
        tiny_qwen_server, path, content='{"extra": {"calibration_temperature": 1e999}}'
    )
    assert (
        overflow.status_code == status
        and "too large for a 64-bit float" in overflow.text
    )
    after = decision_samples(tiny_qwen_server)
    moved = total(after, "vllm:decision_requests_total", endpoint=path) - total(
        before, "vllm:decision_requests_total", endpoint=path
    )
    errors = total(
        after, "vllm:decision_requests_total", endpoint=path, outcome="client_error"
    ) - total(
        before, "vllm:decision_requests_total", endpoint=path, outcome="client_error"
    )
    assert moved == errors == 2


def test_a_client_that_leaves_mid_body_is_counted_cancelled(tiny_qwen_server):
    before = decision_samples(tiny_qwen_server)
    host, port = tiny_qwen_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/decisions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TINY_QWEN_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n".encode()
            + b'{"model": "m", '
        )
        time.sleep(0.5)
    requests = "vllm:decision_requests_total"
    deadline = time.monotonic() + 30
    while (
        moved := total(
            decision_samples(tiny_qwen_server), requests, endpoint="/v1/decisions"
        )
        - total(before, requests, endpoint="/v1/decisions")
    ) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = decision_samples(tiny_qwen_server)

    def change(name: str, **labels: str) -> float:
        return total(after, name, endpoint="/v1/decisions", **labels) - total(
            before, name, endpoint="/v1/decisions", **labels
        )

    assert moved == 1 and change(requests, outcome="cancelled") == 1
    assert change(requests, outcome="server_error") == 0
    assert change("vllm:decision_refusals_total") == 0


@pytest.mark.parametrize("path", WIRES)
@pytest.mark.parametrize("backend", ["canvas", "encoder"])
def test_a_backend_that_cant_serve_this_model_is_a_4xx_naming_what_to_change(
    tiny_qwen_server, path, backend
):
    body, status = WIRES[path]
    response = post(tiny_qwen_server, path, {**body, "extra": {"backend": backend}})
    assert response.status_code == status, response.text  # not 503: retrying can't help
    assert f"backend {backend!r} could not start for this model" in response.text
    assert "leave extra.backend out" in response.text
    assert (
        str(model_path("tiny-qwen2-random")) not in response.text
        and "Traceback" not in response.text
    )
    # and the server serves on
    assert post(tiny_qwen_server, path, body).status_code == 200
