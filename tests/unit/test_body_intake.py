"""What a decision route does with a body's bytes before any model work (wire/body.py,
wire/decision_route.py), driven over raw ASGI so each test sees exactly which bytes the route asked for:
JSON only (415), a declared length over the limit refused before a byte is read, a streamed body that
stops being read at the limit, a compressed one decoded no further than the limit (each piece claimed), the bytes in flight
bounded with small requests still taken, request ids of bounded length, a body that stops arriving."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import pytest
from fastapi import FastAPI

from vllm.entrypoints.generate.decisions.decide import paths
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.api_router import (
    register_decisions_api_router,
)
from vllm.entrypoints.generate.decisions.http.wire.body import (
    LARGE_BODY_BYTES,
    BodiesInFlight,
    Decoder,
)

from .fakes import ScriptedBackend
from .test_wire import JEV_REQUEST, OPENAI_REQUEST, descending

LIMIT = 20000
REQUESTS = {paths.DECISIONS: OPENAI_REQUEST, paths.SYSTEMONE: JEV_REQUEST}


class Sent:
    """One request's bytes as a client sends them, chunk by chunk; counts what the route read."""

    def __init__(self, chunks: list[bytes], stall: bool = False) -> None:
        self.chunks = list(chunks)
        self.read = 0
        self.stall = stall

    async def receive(self) -> dict[str, Any]:
        if not self.chunks:
            if self.stall:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}
        chunk = self.chunks.pop(0)
        self.read += len(chunk)
        more = bool(self.chunks) or self.stall
        return {"type": "http.request", "body": chunk, "more_body": more}


async def call(
    app: FastAPI, path: str, sent: Sent, headers: dict[str, str]
) -> tuple[int, dict[str, str], Any]:
    """The route's status, headers and JSON body for ``sent`` under ``headers``."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("wire", 80),
        "app": app,
    }
    out: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            out["body"] += message.get("body", b"")

    await app(scope, sent.receive, send)
    return out["status"], out["headers"], json.loads(out["body"] or b"null")


def message(path: str, body: Any) -> str:
    """The refusal's message in its wire's shape."""
    if path == paths.DECISIONS:
        return body["error"]["message"]
    detail = body["detail"]
    return detail[0]["msg"] if isinstance(detail, list) else detail["message"]


JSON = {"content-type": "application/json"}


@pytest.fixture
async def app() -> FastAPI:
    settings = Settings.from_env({"VLLM_TYPED_DECISIONS_MAX_BODY_BYTES": str(LIMIT)})
    service = DecisionService(settings, ScriptedBackend(descending), "served-model")
    await service.start()
    app = FastAPI()
    register_decisions_api_router(app)
    app.state.decision_service = service
    return app


@pytest.mark.parametrize("path", REQUESTS)
@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ],
)
async def test_only_json_is_decided(app, path, content_type):
    headers = {"content-type": content_type} if content_type else {}
    sent = Sent([json.dumps(REQUESTS[path]).encode()])
    status, response_headers, body = await call(app, path, sent, headers)
    assert status == 415 and "application/json" in message(path, body)
    assert sent.read == 0 and response_headers["connection"] == "close"


@pytest.mark.parametrize("path", REQUESTS)
async def test_json_with_a_charset_is_decided(app, path):
    headers = {"content-type": "Application/JSON; charset=utf-8"}
    sent = Sent([json.dumps(REQUESTS[path]).encode()])
    status, _, _ = await call(app, path, sent, headers)
    assert status == 200


@pytest.mark.parametrize("path", REQUESTS)
async def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read(
    app, path
):
    sent = Sent([b"{}"], stall=True)
    status, headers, body = await asyncio.wait_for(
        call(app, path, sent, {**JSON, "content-length": "100000000"}), 5
    )
    assert status == 413 and "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in message(
        path, body
    )
    assert sent.read == 0 and headers["connection"] == "close"


async def test_a_streamed_body_stops_being_read_at_the_limit(app):
    sent = Sent([b"x" * 4096] * 100)
    status, _, body = await call(app, paths.DECISIONS, sent, JSON)
    assert status == 413 and "over the limit of 20000" in message(paths.DECISIONS, body)
    assert sent.read <= LIMIT + 4096


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
async def test_a_compression_bomb_is_decoded_no_further_than_the_limit(encoding):
    from backports import zstd

    bomb = b"[" + b"{}," * 10_000_000 + b"{}]"
    packed = gzip.compress(bomb) if encoding == "gzip" else zstd.compress(bomb)
    pool = BodiesInFlight(10 * LIMIT)
    claim = pool.claim()
    with pytest.raises(DecisionError) as refused:
        Decoder(encoding, LIMIT).decoded(packed, claim)
    assert (
        refused.value.status == 413 and "decoded request body" in refused.value.message
    )
    # no more than the limit was ever decoded and kept
    assert claim.size <= LIMIT


def test_what_is_decoded_is_claimed():
    body = json.dumps({"state": "word " * 100_000}).encode()
    pool = BodiesInFlight(1 << 30)
    claim = pool.claim()
    assert Decoder("gzip", 1 << 20).decoded(gzip.compress(body), claim) == body
    assert claim.size == pool.held == len(body)


async def test_a_compressed_body_decodes_across_chunks(app):
    raw = json.dumps(REQUESTS[paths.SYSTEMONE]).encode()
    packed = gzip.compress(raw)
    chunks = [packed[i : i + 7] for i in range(0, len(packed), 7)]
    status, _, _ = await call(
        app,
        paths.SYSTEMONE,
        Sent(chunks),
        {**JSON, "content-encoding": "gzip"},
    )
    assert status == 200


@pytest.mark.parametrize(
    ("packed", "problem"),
    [
        (gzip.compress(b"{}", mtime=0) * 2, "data after the end"),
        (gzip.compress(b"{}", mtime=0)[:-4], "truncated"),
        (zlib.compress(b"{}"), "not a complete, valid gzip stream"),
    ],
)
def test_gzip_that_is_not_one_whole_stream_is_refused(packed, problem):
    with pytest.raises(DecisionError, match="could not decode the gzip"):
        Decoder("gzip", LIMIT).decoded(packed)


def test_bodies_in_flight_leave_room_for_small_ones():
    pool = BodiesInFlight(400_000)
    large = [pool.claim() for _ in range(4)]
    for claim in large[:3]:
        claim.grow(100_000)  # three quarters of the pool: all large bodies may hold
    with pytest.raises(DecisionError) as busy:
        large[3].grow(LARGE_BODY_BYTES)
    assert busy.value.status == 503 and busy.value.retry_after == 1
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES_IN_FLIGHT" in busy.value.message
    small = pool.claim()
    small.grow(LARGE_BODY_BYTES - 1)  # a small body still gets in
    for claim in large:
        claim.release()
    small.release()
    small.release()  # once only
    small.grow(10)  # a released claim takes nothing more
    assert pool.held == 0


@pytest.mark.parametrize("path", REQUESTS)
async def test_a_full_server_refuses_at_once_with_retry_after(app, path):
    pool = app.state.decision_bodies_in_flight = BodiesInFlight(2 * LIMIT)
    others = pool.claim()
    others.grow(2 * LIMIT - 100)
    raw = json.dumps(REQUESTS[path]).encode()
    sent = Sent([raw], stall=True)
    status, headers, body = await asyncio.wait_for(
        call(app, path, sent, {**JSON, "content-length": str(len(raw))}), 5
    )
    assert status == 503 and headers["retry-after"] == "1", body
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES_IN_FLIGHT" in message(path, body)
    assert sent.read == 0 and headers["connection"] == "close"
    others.release()
    status, _, _ = await call(app, path, Sent([raw]), JSON)
    assert status == 200 and pool.held == 0


@pytest.mark.parametrize("path", REQUESTS)
async def test_every_claim_is_given_back(app, path):
    pool = app.state.decision_bodies_in_flight = BodiesInFlight(16 * LIMIT)
    raw = json.dumps(REQUESTS[path]).encode()
    for sent, headers in [
        (Sent([raw]), JSON),
        (Sent([b"{"]), JSON),
        (Sent([b"x" * 4096] * 10), JSON),
        (Sent([raw[:10]]), JSON),  # the client leaves mid-body
    ]:
        await call(app, path, sent, headers)
        assert pool.held == 0


@pytest.mark.parametrize("path", REQUESTS)
async def test_a_long_request_id_is_refused_and_not_echoed(app, path):
    long_id = "r" * 2_000_000
    sent = Sent([json.dumps(REQUESTS[path]).encode()])
    status, headers, body = await call(
        app, path, sent, {**JSON, "x-request-id": long_id}
    )
    assert status in (400, 422) and "X-Request-Id" in message(path, body)
    assert all(len(value) < 200 for value in headers.values())
    assert len(json.dumps(body)) < 1000


@pytest.mark.parametrize("path", REQUESTS)
async def test_a_body_that_stops_arriving_times_out(app, path, monkeypatch):
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "1")
    sent = Sent([b'{"inp'], stall=True)
    status, _, body = await asyncio.wait_for(call(app, path, sent, JSON), 10)
    assert status == 408 and "VLLM_HTTP_TIMEOUT_KEEP_ALIVE" in message(path, body)
