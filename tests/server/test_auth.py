"""With --api-key, every decision path requires it (Bearer), /api/alpha/decisions included; and with
decisions on, ``/v1/systemone`` is ours on every vLLM version, though vLLM 0.32 serves one of its own
(the route is taken over; test_disabled.py checks upstream's with decisions off). Runs on vLLM 0.30 and,
in tools/test.sh's second pass, on 0.32."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import openai
import pytest
import typesafe_sdk

from ..conftest import ROOT
from ..fuzzing import path_variants
from .conftest import TINY_QWEN_KEY

KEY = TINY_QWEN_KEY
pytestmark = pytest.mark.vllm032


@pytest.fixture(scope="module")
def keyed_server(tiny_qwen_server):
    return tiny_qwen_server


BODIES = {
    "/v1/decisions": {
        "model": "m",
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "?"}],
    },
    "/v1/systemone": {
        "state": "x",
        "questions": {"q": {"type": "noul", "instructions": "?"}},
    },
    "/api/alpha/decisions": {
        "state": "x",
        "questions": {"q": {"type": "noul", "instructions": "?"}},
    },
}


@pytest.mark.parametrize("path", list(BODIES))
def test_key_required_on_every_decision_path(keyed_server, path):
    url = keyed_server.url + path
    assert httpx.post(url, json=BODIES[path], timeout=60).status_code == 401
    wrong = httpx.post(
        url, json=BODIES[path], headers={"Authorization": "Bearer nope"}, timeout=60
    )
    assert wrong.status_code == 401
    right = httpx.post(
        url, json=BODIES[path], headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert right.status_code == 200, right.text
    # A bad body without the key says nothing about the body: the key is checked first.
    assert httpx.post(url, content=b"{not json", timeout=60).status_code == 401


def test_sdks_send_the_key(keyed_server):
    oai = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=KEY, max_retries=0)
    assert oai.decisions.create(
        model="m", input="x", questions=[{"type": "predicate", "instructions": "?"}]
    ).answers
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{keyed_server.url}/v1", api_key="bad", max_retries=0
        ).decisions.create(
            model="m", input="x", questions=[{"type": "predicate", "instructions": "?"}]
        )
    ts = typesafe_sdk.TypeSafeClient(api_key=KEY, base_url=keyed_server.url)
    assert (
        ts.system_one("x", {"q": typesafe_sdk.Noul(instructions="?")}).answers["q"].noul
        >= 0
    )
    with pytest.raises(typesafe_sdk.TypeSafeAuthenticationError):
        typesafe_sdk.TypeSafeClient(
            api_key="bad", base_url=keyed_server.url
        ).system_one("x", {"q": typesafe_sdk.Noul(instructions="?")})


def sample_decision(port: int, key: str) -> subprocess.CompletedProcess[str]:
    """tools/serve.sh's sample decision, its key in VLLM_API_KEY as serve.sh passes it."""
    return subprocess.run(
        [sys.executable, "-m", "tools.examples.sample_decision", "--port", str(port)]
        + ["--wait", "120"],
        env={**os.environ, "VLLM_API_KEY": key},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_sample_decision_sends_the_key(keyed_server):
    """The README's main job on a server with a key: the sample decision is answered; with the
    wrong key it stops at once, naming the setting, instead of waiting out --wait."""
    answered = sample_decision(keyed_server.port, KEY)
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["answers"]
    refused = sample_decision(keyed_server.port, "bad")
    assert refused.returncode == 1
    assert "refused the API key (401)" in refused.stderr
    assert "VLLM_API_KEY" in refused.stderr


def test_systemone_is_ours_with_the_same_probabilities_as_decisions(keyed_server):
    """One operation per decision path on /openapi.json, ours (not vLLM 0.32's
    ``create_structured_decision``), and one question read alike on both wires."""
    spec = httpx.get(f"{keyed_server.url}/openapi.json", timeout=30).json()
    paths, schemas = spec["paths"], spec["components"]["schemas"]
    for path in BODIES:
        assert (
            list(paths[path]) == ["post"]
            and "structured_decision" not in paths[path]["post"]["operationId"]
        )
        # the body is documented from the wire's request model, though the route reads it itself
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]
        documented = schemas[body["schema"]["$ref"].rsplit("/", 1)[1]]["properties"]
        assert set(BODIES[path]) <= set(documented)
    keyed = {"Authorization": f"Bearer {KEY}"}
    question = "Does the customer ask for a refund?"
    state = "I was charged twice for my order and want my money back."
    openai_answer = httpx.post(
        f"{keyed_server.url}/v1/decisions",
        headers=keyed,
        timeout=60,
        json={
            "model": "m",
            "input": state,
            "questions": [{"type": "predicate", "instructions": question}],
        },
    )
    jev_answer = httpx.post(
        f"{keyed_server.url}/v1/systemone",
        headers=keyed,
        timeout=60,
        json={
            "state": state,
            "questions": {"refund": {"type": "noul", "instructions": question}},
        },
    )
    assert openai_answer.status_code == jev_answer.status_code == 200, (
        openai_answer.text,
        jev_answer.text,
    )
    assert "x-decision-latency-ms" in jev_answer.headers
    probability = openai_answer.json()["answers"][0]["probability"]
    assert probability == pytest.approx(
        jev_answer.json()["answers"]["refund"]["noul"], abs=1e-6
    )


def raw_request(url: str, method: str, target: str, body: bytes) -> tuple[int, bytes]:
    """One request written byte for byte on a socket, as an attacker sends it (no client normalises
    the path): the status and the body."""
    parts = urlsplit(url)
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(head.encode() + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("path", list(BODIES))
def test_no_spelling_of_a_decision_path_answers_without_the_key_over_raw_http(
    keyed_server, path
):
    """Trailing newline or CR (%0A, %0D), slashes, case, query strings, every method: refused, never
    answered (``POST /api/alpha/decisions%0A`` once was)."""
    body = json.dumps(BODIES[path]).encode()
    for target in path_variants(path):
        for method in ("POST", "GET", "PUT", "PATCH", "DELETE", "OPTIONS"):
            status, content = raw_request(keyed_server.url, method, target, body)
            # vLLM lets OPTIONS (CORS preflights) past the key: at most a redirect to the path as written.
            refused = (401, 404, 405, 307) if method == "OPTIONS" else (401, 404, 405)
            assert status in refused, (method, target, status, content[:200])
            assert b"answers" not in content, (method, target)
