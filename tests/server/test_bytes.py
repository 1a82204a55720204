"""Hostile bytes on a real server (issue 50), over raw sockets, on the session servers as users run them:
SmolLM2 without a key and the tiny Qwen behind ``--api-key``, every byte limit at its default. A declared
length over the limit is refused before the body is sent; only JSON is decided; request ids are bounded;
the body bytes in flight are bounded, with small requests still answered."""

from __future__ import annotations

import gzip
import json
import socket
import time
from contextlib import ExitStack, closing

import httpx
import pytest

import vllm

from .conftest import TINY_QWEN_KEY, VllmServer

pytestmark = pytest.mark.vllm032

MAX_BODY_BYTES = 4 * 1024 * 1024
SERVERS = ["server", "tiny_qwen_server"]
PATHS = ["/v1/decisions", "/v1/systemone"]


KEYS = {"server": {}, "tiny_qwen_server": {"Authorization": f"Bearer {TINY_QWEN_KEY}"}}


@pytest.fixture(params=SERVERS)
def any_server(request) -> VllmServer:
    # On vLLM 0.32 only the keyed server is started (tools/test.sh's second pass is kept short).
    if request.param == "server" and vllm.__version__.startswith("0.32"):
        pytest.skip("the session server without a key is tested on vLLM 0.30")
    server = request.getfixturevalue(request.param)
    server.key = KEYS[request.param]
    return server


def key(server: VllmServer) -> dict[str, str]:
    return server.key


def request_body(server: VllmServer, path: str) -> dict:
    if path == "/v1/decisions":
        return {
            "model": server.model,
            "input": "The parcel is late.",
            "questions": [{"type": "predicate", "instructions": "Late?"}],
        }
    return {
        "state": "The parcel is late.",
        "questions": {"late": {"type": "noul", "instructions": "Late?"}},
    }


def connect(server: VllmServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def head(server: VllmServer, path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        f"Content-Length: {length}",
        *(f"{k}: {v}" for k, v in {**key(server), **headers}.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def response_of(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response read off ``sock``: status, headers (lower case), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = top.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(":") for line in header_lines)
    }
    while len(rest) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return int(status_line.split()[1]), headers, rest


def message(path: str, body: bytes) -> str:
    payload = json.loads(body)
    if path == "/v1/decisions":
        return payload["error"]["message"]
    detail = payload["detail"]
    return detail[0]["msg"] if isinstance(detail, list) else detail["message"]


@pytest.mark.parametrize("path", PATHS)
def test_a_declared_length_over_the_limit_is_refused_before_the_body(any_server, path):
    with closing(connect(any_server)) as sock:
        started = time.monotonic()
        sock.sendall(
            head(any_server, path, {"Content-Type": "application/json"}, 100_000_000)
            + b'{"state": "x", "questions":'
        )
        status, headers, body = response_of(sock)
        waited = time.monotonic() - started
    assert status == 413 and "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in message(
        path, body
    )
    assert headers["connection"] == "close"
    # not a timing check: the body's other 99,999,972 bytes never came, so the answer didn't wait for them
    assert waited < 30


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ],
)
def test_only_json_is_decided_whatever_a_web_page_sends(any_server, path, content_type):
    # what a page's form or fetch can send to any origin without asking first (no CORS preflight)
    response = httpx.post(
        any_server.url + path,
        content=json.dumps(request_body(any_server, path)),
        headers={
            **key(any_server),
            "Content-Type": content_type,
            "Origin": "http://evil.example",
        },
        timeout=60,
    )
    assert response.status_code == 415, response.text
    assert "application/json" in message(path, response.content)
    assert "answers" not in response.json()


@pytest.mark.parametrize("path", PATHS)
def test_a_long_request_id_is_refused_not_echoed(any_server, path):
    long_id = "r" * 2_000_000
    for headers in ({**key(any_server)}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(
            any_server.url + path,
            json=request_body(any_server, path),
            headers={**headers, "X-Request-Id": long_id},
            timeout=60,
        )
        assert response.status_code in (400, 401, 422), response.text
        assert len(response.content) + sum(map(len, response.headers.values())) < 4096


@pytest.mark.parametrize("path", PATHS)
def test_a_compressed_body_is_refused_once_decoded_past_the_limit(any_server, path):
    bomb = json.dumps(
        {**request_body(any_server, path), "padding": [{}] * (MAX_BODY_BYTES // 3)}
    ).encode()
    response = httpx.post(
        any_server.url + path,
        content=gzip.compress(bomb),
        headers={
            **key(any_server),
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        },
        timeout=60,
    )
    assert response.status_code == 413
    assert "decoded request body is over the limit" in message(path, response.content)


def test_bodies_in_flight_are_bounded_and_small_requests_still_answered(any_server):
    """Twelve bodies at the limit, announced and held unfinished, fill the three quarters of the default
    budget (16 x MAX_BODY_BYTES) large bodies may hold: the next one is refused at once, a small request
    is answered, and once the twelve hang up, a large body is taken again."""
    path = "/v1/systemone"
    announce = head(
        any_server, path, {"Content-Type": "application/json"}, MAX_BODY_BYTES
    )
    with ExitStack() as held:
        for _ in range(12):
            sock = held.enter_context(closing(connect(any_server)))
            sock.sendall(announce + b'{"state": "')
        time.sleep(0.5)  # the server has taken each one's headers
        with closing(connect(any_server)) as sock:
            sock.sendall(announce)
            status, headers, body = response_of(sock)
        assert status == 503 and headers["retry-after"] == "1", body
        assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES_IN_FLIGHT" in message(path, body)
        small = httpx.post(
            any_server.url + path,
            json=request_body(any_server, path),
            headers=key(any_server),
            timeout=120,
        )
        assert small.status_code == 200, small.text
    time.sleep(0.5)  # their disconnects reach the server
    with closing(connect(any_server)) as sock:
        sock.sendall(announce + b"x" * MAX_BODY_BYTES)
        status, _, body = response_of(sock)
    assert status == 422, (
        body
    )  # taken, read and found to be no JSON: not refused as busy
