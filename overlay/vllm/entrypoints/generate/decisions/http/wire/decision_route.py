# SPDX-License-Identifier: Apache-2.0
"""The route class of the decision endpoints: what a decision request meets over HTTP, whichever wire
format it speaks.

The API key (vLLM's check, see auth.py), the body size limit, ``Content-Encoding`` decoding and
strict JSON (body.py); then the wire's own handling (wire/handling.py: validation, the decision, any
refusal in the wire's shape), the same code bulk calls, under vLLM's ``with_cancellation`` (a client
that leaves cancels it) and ``load_aware_call`` (``--enable-server-load-tracking``); after it,
``Retry-After`` on temporary refusals, the request id and the server-side time as headers.

FastAPI does not validate these routes' bodies (the wire does, for bulk too): a route's endpoint
function only gives ``/openapi.json`` its request and response models.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from vllm.entrypoints.generate.decisions.decide.concurrency import off_the_loop
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.metrics import observed_route
from vllm.entrypoints.generate.decisions.decide.settings import DEFAULT_MAX_BODY_BYTES
from vllm.entrypoints.generate.decisions.http.wire.auth import AUTHORIZED, key_required
from vllm.entrypoints.generate.decisions.http.wire.body import decode_body, parse_json
from vllm.entrypoints.generate.decisions.http.wire.common import decision_service
from vllm.entrypoints.generate.decisions.http.wire.handling import (
    Reply,
    Wire,
    new_request_id,
)
from vllm.entrypoints.serve.utils.api_utils import load_aware_call, with_cancellation

LATENCY_HEADER = "x-decision-latency-ms"
REQUEST_ID_HEADER = "X-Request-Id"


# Bodies at least this long, and compressed ones, are decoded and parsed off the event loop: tens of MiB take the event loop
# (every other client's request, /health) a good part of a second; small ones aren't worth the hop.
PARSE_IN_THREAD_BYTES = 64 * 1024


async def request_body(request: Request) -> Any:
    """The body as JSON: size-limited, decoded and parsed strictly (body.py)."""
    service = getattr(request.app.state, "decision_service", None)
    limit = (
        service.settings.max_body_bytes
        if service is not None
        else DEFAULT_MAX_BODY_BYTES
    )
    raw, encoding = await request.body(), request.headers.get("content-encoding")
    if len(raw) < PARSE_IN_THREAD_BYTES and not encoding:
        return parse_json(decode_body(raw, encoding, limit))
    return await off_the_loop(lambda: parse_json(decode_body(raw, encoding, limit)))


def authorized(request: Request) -> bool:
    """Fail closed: with a key configured, only a verdict of True from auth.py lets a request through."""
    return (
        not key_required(getattr(request.app.state, "args", None))
        or request.scope.get(AUTHORIZED) is True
    )


def decision_route(wire: Wire) -> type[APIRoute]:
    """A route class answering ``wire``'s paths through ``wire``, refusals in its error shape; the
    request id is also echoed under each of ``wire.id_headers`` (a wire's own clients may read another
    header)."""

    async def answered(body: Any, raw_request: Request, request_id: str) -> Reply:
        return await wire.answer(
            lambda: decision_service(raw_request), body, request_id
        )

    # vLLM's wrappers find the request as the second argument; with_cancellation gives None when the client left.
    answer_unless_cancelled = with_cancellation(load_aware_call(answered))

    class DecisionRoute(APIRoute):
        # auth.py lets a request with a bad key through to this route only, which refuses it itself.
        checks_decision_authorization = True

        def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
            super().__init__(path, *args, **kwargs)
            # The path exactly: Starlette's pattern ends in "$", which in Python also matches before a
            # trailing newline, so "/v1/decisions\n" (sent as %0A) would be answered here.
            self.path_regex = re.compile(re.escape(path) + r"\Z")

        def get_route_handler(
            self,
        ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            if self.path not in wire.paths:
                raise ValueError(
                    f"{self.path} is not one of this wire's paths ({', '.join(wire.paths)})"
                )

            async def handle_decision(request: Request) -> Response:
                started = time.perf_counter()
                # The request's one id: its engine reads and its response's id derive from it.
                request_id = request.headers.get(REQUEST_ID_HEADER) or new_request_id()
                try:
                    if not authorized(request):
                        raise DecisionError(
                            "Unauthorized: send the server's API key as 'Authorization: Bearer KEY'",
                            HTTPStatus.UNAUTHORIZED,
                        )
                    body = await request_body(request)
                except DecisionError as exc:
                    reply: Reply | None = wire.refusal(exc)
                except ClientDisconnect:
                    # the client left before its body arrived: cancelled, not a fault
                    reply = None
                else:
                    reply = await answer_unless_cancelled(body, request, request_id)
                # A client that left reads nothing; metrics.py counts the request as cancelled.
                response = reply.response() if reply is not None else Response()
                # vLLM's own middleware echoes X-Request-Id when --enable-request-id-headers is on.
                echoes = getattr(request.app.state, "decision_echo_request_id", True)
                for header in (
                    (REQUEST_ID_HEADER,) if echoes else ()
                ) + wire.id_headers:
                    response.headers[header] = request_id
                response.headers[LATENCY_HEADER] = (
                    f"{(time.perf_counter() - started) * 1000:.1f}"
                )
                return response

            # metrics.py: counted and timed
            return observed_route(self.path, handle_decision)

    return DecisionRoute
