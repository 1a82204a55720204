# SPDX-License-Identifier: Apache-2.0
"""A decision request over HTTP (:func:`respond`, what each decision endpoint returns): the API key,
request id, media type and declared size before a byte of the body is held, then the body (body.py)
and the wire's handling (handling.py), under vLLM's ``with_cancellation`` and ``load_aware_call``.
FastAPI does not read these bodies (:func:`decision_route`); it documents the wire's request model."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine
from functools import partial
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.datastructures import State
from starlette.requests import ClientDisconnect

from vllm.entrypoints.generate.decisions.decide.concurrency import parsed_off_the_loop
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.metrics import observed_route
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.wire.auth import AUTHORIZED, key_required
from vllm.entrypoints.generate.decisions.http.wire.body import (
    LARGE_BODY_BYTES,
    BodiesInFlight,
    Claim,
    Decoder,
    let_go,
    media_type,
    parse_json,
    read_body,
    yielding_to_the_loop,
)
from vllm.entrypoints.generate.decisions.http.wire.common import decision_service
from vllm.entrypoints.generate.decisions.http.wire.handling import (
    Reply,
    Wire,
    new_request_id,
)
from vllm.entrypoints.serve.utils.api_utils import load_aware_call, with_cancellation

LATENCY_HEADER = "x-decision-latency-ms"
REQUEST_ID_HEADER = "X-Request-Id"
# Longer request ids are refused, not cut: one comes back in headers and names every engine read.
MAX_REQUEST_ID_CHARS = 128
REQUEST_ID = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID_CHARS}}}")


def given_request_id(request: Request) -> str | None:
    """The client's ``X-Request-Id`` when it is one the server repeats; None when absent or not."""
    given = request.headers.get(REQUEST_ID_HEADER)
    return given if given and REQUEST_ID.fullmatch(given) else None


def bodies_in_flight(state: State, settings: Settings) -> BodiesInFlight:
    """This API-server process's body bytes in flight, counted from its first decision request."""
    pool = getattr(state, "decision_bodies_in_flight", None)
    if pool is None:
        pool = state.decision_bodies_in_flight = BodiesInFlight(
            settings.max_body_bytes_in_flight
        )
    return pool


@with_cancellation  # None when the client left; both find the request as the second argument
@load_aware_call
async def answered(
    wire: Wire,
    raw_request: Request,
    raw: bytes,
    request_id: str,
    decoder: Decoder,
    claim: Claim,
) -> Reply:
    def validated(large: bool = False) -> BaseModel | Reply:
        # the parsed JSON lives only until it is validated: what no field keeps is let go here, a
        # large body's a piece at a time
        held = [parse_json(decoder.decoded(raw, claim))]
        request = wire.request_of(held[0])
        if large:
            let_go(held.pop())
        return request

    try:
        # decoding and parsing a large body take the parsing thread (zlib and zstd let go of the
        # GIL while they decode), a small plain one is parsed here at once
        small = decoder.decompressor is None and len(raw) < LARGE_BODY_BYTES
        request = (
            validated()
            if small
            else await parsed_off_the_loop(
                yielding_to_the_loop, partial(validated, True)
            )
        )
    except DecisionError as exc:
        return wire.refusal(exc)
    return await wire.decide(lambda: decision_service(raw_request), request, request_id)


async def reply_to(
    wire: Wire, request: Request, request_id: str
) -> tuple[Reply | None, bool]:
    """The reply (None: the client left), and whether the whole body was read."""
    claim = None
    try:
        # fail closed: with a key configured, only a verdict of True from auth.py lets it through
        if (
            key_required(getattr(request.app.state, "args", None))
            and request.scope.get(AUTHORIZED) is not True
        ):
            raise DecisionError(
                "Unauthorized: send the server's API key as 'Authorization: Bearer KEY'",
                HTTPStatus.UNAUTHORIZED,
            )
        if request.headers.get(REQUEST_ID_HEADER) and not given_request_id(request):
            raise DecisionError(
                f"{REQUEST_ID_HEADER} must be 1 to {MAX_REQUEST_ID_CHARS} printable ASCII "
                "characters without spaces; leave it out and the server makes one"
            )
        media_type(request)
        settings = decision_service(request).settings
        decoder = Decoder(
            request.headers.get("content-encoding"), settings.max_body_bytes
        )
        claim = bodies_in_flight(request.app.state, settings).claim()
        raw = await read_body(request, settings.max_body_bytes, claim)
        return await answered(wire, request, raw, request_id, decoder, claim), True
    except DecisionError as exc:
        return wire.refusal(exc), False
    except ClientDisconnect:
        # the client left before its body arrived: cancelled, not a fault
        return None, False
    finally:
        if claim is not None:
            claim.release()


async def respond(wire: Wire, request: Request) -> Response:
    """A decision request on ``wire``, whole: what each decision endpoint returns."""
    started = time.perf_counter()
    request_id = given_request_id(request) or new_request_id()
    reply, body_read = await reply_to(wire, request, request_id)
    # A client that left reads nothing; metrics.py counts the request as cancelled.
    response = reply.response() if reply is not None else Response()
    if not body_read:
        # the rest of the body is not read, so the connection can't carry another request
        response.headers["Connection"] = "close"
    # vLLM's own middleware echoes X-Request-Id when --enable-request-id-headers is on.
    echoes = getattr(request.app.state, "decision_echo_request_id", True)
    for header in ((REQUEST_ID_HEADER,) if echoes else ()) + wire.id_headers:
        response.headers[header] = request_id
    response.headers[LATENCY_HEADER] = f"{(time.perf_counter() - started) * 1000:.1f}"
    return response


def decision_route(wire: Wire) -> type[APIRoute]:
    """Routes whose endpoint gets the bare request (it reads the body itself, against the byte
    budget), counted and timed (metrics.py), with ``wire.request_model`` as the documented body."""

    def documented(path: str) -> Any:
        async def endpoint(request: BaseModel) -> None: ...

        endpoint.__annotations__["request"] = wire.request_model
        return APIRoute(path, endpoint).body_field

    class DecisionRoute(APIRoute):
        # auth.py lets a request with a bad key through to this route only, which refuses it itself.
        checks_decision_authorization = True

        def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
            if path not in wire.paths:
                raise ValueError(
                    f"{path} is not one of this wire's paths ({', '.join(wire.paths)})"
                )
            super().__init__(path, *args, **kwargs)
            # The path exactly: Starlette's pattern ends in "$", which also matches before a trailing
            # newline, so "/v1/decisions\n" (sent as %0A) would be answered here.
            self.path_regex = re.compile(re.escape(path) + r"\Z")
            self.body_field = documented(path)

        def get_route_handler(
            self,
        ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            return observed_route(self.path, self.endpoint)

    return DecisionRoute
