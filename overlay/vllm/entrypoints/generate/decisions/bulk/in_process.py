# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints called in process: the server's own routes, validation, decision service and
error bodies, with no server, socket or HTTP client in between.

For notebooks and pipelines that hold a vLLM engine (``AsyncLLM``) and for ``vllm run-batch``: a
request body in, the status and JSON body the server would have answered out.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from argparse import Namespace
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from vllm.engine.protocol import EngineClient

from ..api_router import register_decisions_api_router
from ..routing import REQUEST_ID_HEADER
from ..service import DecisionService
from ..startup import build_service, start_service

DECISION_URLS = ("/v1/decisions", "/v1/systemone", "/api/alpha/decisions")


@dataclass(frozen=True)
class Result:
    """One request's answer, as the server would have sent it."""

    status: int
    body: Any  # the JSON body: the decision, or the wire's error body
    request_id: str

    @property
    def ok(self) -> bool:
        return self.status == 200


class Decisions:
    """Decide requests of either wire format in process::

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model="HuggingFaceTB/SmolLM2-135M-Instruct"))
        decisions = await Decisions.start(engine)
        result = await decisions.decide({"model": "m", "input": "Refund not received after 10 days.",
                                         "questions": [{"type": "predicate", "instructions": "Is it urgent?"}]})
        result.body["answers"][0]["probability"]

    ``VLLM_TYPED_DECISIONS_*`` variables apply as they do to a server.
    """

    def __init__(self, service: DecisionService) -> None:
        self.service = service
        self.app = FastAPI()
        register_decisions_api_router(self.app)
        self.app.state.decision_service = service

    @classmethod
    async def start(cls, engine_client: EngineClient, served_model: str | None = None,
                    args: Namespace | None = None) -> Decisions:  # fmt: skip
        """The decision service over ``engine_client``, started as a server's is (the backend's startup
        check, then the saved calibration or a new one); ``args`` are vLLM's frontend arguments when
        there are some (``vllm run-batch`` passes its own). Raises if the backend can't serve the model."""
        if args is None:
            args = Namespace(model=engine_client.model_config.model, served_model_name=served_model and [served_model])
        service, model = build_service(engine_client, args)
        await start_service(service, model)
        if service.readiness.failure is not None:
            raise RuntimeError(f"decisions are unavailable on this model: {service.readiness.failure}")
        return cls(service)

    async def decide(self, body: Any, url: str = "/v1/decisions", request_id: str | None = None) -> Result:
        """One request: ``body`` as JSON text or bytes (parsed as strictly as the server does) or an
        already-parsed value; ``url`` names the wire format."""
        if url not in DECISION_URLS:
            raise ValueError(f"url {url!r}: not a decision endpoint ({', '.join(DECISION_URLS)})")
        raw = (
            body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        request_id = request_id or uuid.uuid4().hex
        status, payload = await call(self.app, url, raw, request_id)
        return Result(status, json.loads(payload) if payload else None, request_id)

    async def decide_many(self, bodies: Iterable[Any], url: str = "/v1/decisions",
                          in_flight: int = 64) -> AsyncIterator[Result]:  # fmt: skip
        """Every body's result, in order, with at most ``in_flight`` requests at the engine at once."""
        window: list[asyncio.Task[Result]] = []
        for body in bodies:
            window.append(asyncio.ensure_future(self.decide(body, url)))
            if len(window) >= in_flight:
                yield await window.pop(0)
        while window:
            yield await window.pop(0)


async def call(app: FastAPI, path: str, body: bytes, request_id: str) -> tuple[int, bytes]:
    """POST ``body`` to ``path`` on ``app`` through ASGI; the status and response body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": None,
        "server": ("in-process", 0),
        "headers": [(b"content-type", b"application/json"), (REQUEST_ID_HEADER.lower().encode(), request_id.encode())],
    }  # fmt: skip
    delivered = False
    status, chunks = 500, []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the caller waits for its answer
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)
