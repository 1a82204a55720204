# SPDX-License-Identifier: Apache-2.0
"""The route class of the decision endpoints: what every decision request meets before and after its
handler, whichever wire format it speaks.

Before the handler: the API key (vLLM's check, see auth.py), the body size limit, ``Content-Encoding``
decoding and strict JSON (body.py); FastAPI then validates the route's protocol model against what
was parsed here (:class:`ParsedRequest`). After it: any refusal in the wire's own error shape,
``Retry-After`` on temporary refusals, the request id and the server-side time as headers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute

from .auth import AUTHORIZED
from .body import decode_body, parse_json
from .errors import DecisionError
from .metrics import note_refusal, observed_route
from .settings import DEFAULT_MAX_BODY_BYTES

LATENCY_HEADER = "x-decision-latency-ms"
REQUEST_ID_HEADER = "X-Request-Id"

# Renders a refusal in one wire's shape; the list is FastAPI's body errors, when it found any.
ErrorRenderer = Callable[[DecisionError, list[dict[str, Any]] | None], Response]


class ParsedRequest(Request):
    """A decision request whose body was decoded and parsed here; FastAPI's ``body()`` and ``json()``
    return those, so the protocol model validates exactly what the strict parser accepted."""

    def __init__(self, request: Request, body: bytes, parsed: Any) -> None:
        # These routes take JSON whatever the client labelled it (``curl -d`` sends a form type), and
        # the body is already decoded: FastAPI sees a plain JSON request.
        headers = [(k, v) for k, v in request.scope["headers"] if k not in (b"content-type", b"content-encoding")]
        super().__init__({**request.scope, "headers": [*headers, (b"content-type", b"application/json")]},
                         request.receive)  # fmt: skip
        self._decoded, self._parsed = body, parsed

    async def body(self) -> bytes:
        return self._decoded

    async def json(self) -> Any:
        return self._parsed


async def parsed(request: Request) -> ParsedRequest:
    service = getattr(request.app.state, "decision_service", None)
    limit = service.settings.max_body_bytes if service is not None else DEFAULT_MAX_BODY_BYTES
    body = decode_body(await request.body(), request.headers.get("content-encoding"), limit)
    return ParsedRequest(request, body, parse_json(body))


def body_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """FastAPI's body errors reduced to JSON-safe fields (``loc`` starts with "body")."""
    return [
        {"loc": list(e.get("loc", ("body",))), "msg": str(e.get("msg", e)), "type": str(e.get("type", "value_error"))}
        if isinstance(e, dict)
        else {"loc": ["body"], "msg": str(e), "type": "value_error"}
        for e in exc.errors()
    ]


def engine_request_id(request: Request) -> str:
    """This request's id for the engine (each read adds a suffix): the client's ``X-Request-Id`` when it
    sent one, so its reads can be found in vLLM's request log."""
    return f"decision-{request.state.decision_request_id}"


def decision_route(render_error: ErrorRenderer, id_headers: tuple[str, ...] = ()) -> type[APIRoute]:
    """A route class whose refusals all come out in one wire format's error shape; the request id is
    also echoed under each of ``id_headers`` (a wire's own clients may read another header)."""

    class DecisionRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()

            async def handle_decision(request: Request) -> Response:
                started = time.perf_counter()
                request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
                request.state.decision_request_id = request_id
                try:
                    if request.scope.get(AUTHORIZED) is False:
                        raise DecisionError("Unauthorized: send the server's API key as 'Authorization: Bearer KEY'",
                                            HTTPStatus.UNAUTHORIZED)  # fmt: skip
                    response = await handle(await parsed(request))
                except RequestValidationError as exc:
                    response = render_error(DecisionError("invalid request body"), body_errors(exc))
                except DecisionError as exc:
                    note_refusal(exc)  # metrics.py: the refusal's reason
                    response = render_error(exc, None)
                    if exc.retry_after is not None:
                        response.headers["Retry-After"] = str(exc.retry_after)
                # vLLM's own middleware echoes X-Request-Id when --enable-request-id-headers is on.
                echoes = getattr(request.app.state, "decision_echo_request_id", True)
                for header in ((REQUEST_ID_HEADER,) if echoes else ()) + id_headers:
                    response.headers[header] = request_id
                response.headers[LATENCY_HEADER] = f"{(time.perf_counter() - started) * 1000:.1f}"
                return response

            return observed_route(self.path, handle_decision)  # metrics.py: counted and timed

    return DecisionRoute
