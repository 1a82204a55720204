# SPDX-License-Identifier: Apache-2.0
"""The route class of the decision endpoints: everything a request meets before and after its handler.

Per wire format it renders failures in that format's error shape (FastAPI's own body errors
included). For both it checks the API key on paths vLLM's middleware does not guard, applies the
body size limit and ``Content-Encoding`` decoding, adds ``Retry-After`` to temporary refusals (starting, engine queue full),
parses the JSON strictly, and reports the server-side time in a header.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.types import Message, Receive

from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX

from .body import decode_body, parse_json
from .errors import DecisionError
from .settings import DEFAULT_MAX_BODY_BYTES

LATENCY_HEADER = "x-decision-latency-ms"

ErrorRenderer = Callable[[DecisionError, list[dict[str, Any]] | None], JSONResponse]


def body_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """FastAPI's own body errors (malformed JSON, missing body), reduced to JSON-safe fields."""
    return [
        {"loc": list(e.get("loc", ("body",))), "msg": str(e.get("msg", e)), "type": str(e.get("type", "value_error"))}
        if isinstance(e, dict)
        else {"loc": ["body"], "msg": str(e), "type": "value_error"}
        for e in exc.errors()
    ]


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive channel that yields ``body`` once, then the client's own messages (disconnects)."""
    sent = False

    async def receive_again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


def unauthorized(request: Request) -> bool:
    """vLLM's middleware guards /v1 paths when --api-key is set; we guard our other paths the same way."""
    checker = getattr(request.app.state, "decision_auth", None)
    path = request.url.path.removeprefix(request.scope.get("root_path", ""))
    return checker is not None and not path.startswith(GUARDED_PREFIX) and not checker.verify_token(request.headers)


async def decoded(request: Request) -> Request:
    """The request with its body decoded and parsed here, before the handler runs: the parsed JSON is
    in ``request.state.decision_body`` (the handler's disconnect watcher must not race it for the body)."""
    service = getattr(request.app.state, "decision_service", None)
    limit = service.settings.max_body_bytes if service is not None else DEFAULT_MAX_BODY_BYTES
    body = decode_body(await request.body(), request.headers.get("content-encoding"), limit)
    request.state.decision_body = parse_json(body)
    return Request(request.scope, replaying(body, request.receive))


def decision_route(render_error: ErrorRenderer) -> type[APIRoute]:
    """A route class whose failures all come out in one wire format's error shape."""

    class DecisionRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()

            async def handle_decision(request: Request) -> Response:
                started = time.perf_counter()
                try:
                    if unauthorized(request):
                        response: Response = JSONResponse({"error": "Unauthorized"}, HTTPStatus.UNAUTHORIZED)
                    else:
                        response = await handle(await decoded(request))
                except RequestValidationError as exc:
                    errors = body_errors(exc)
                    response = render_error(DecisionError("invalid request body"), errors)
                except DecisionError as exc:
                    response = render_error(exc, None)
                    if exc.retry_after is not None:
                        response.headers["Retry-After"] = str(exc.retry_after)
                response.headers[LATENCY_HEADER] = f"{(time.perf_counter() - started) * 1000:.1f}"
                return response

            return handle_decision

    return DecisionRoute
