# SPDX-License-Identifier: Apache-2.0
"""Routes of the decision endpoints, each wire format with its own error shape.

``/v1/decisions`` reports errors in vLLM's OpenAI error shape; ``/v1/systemone`` (also at
``/api/alpha/decisions``) reports validation errors as 422 ``detail`` lists, as Jev clients expect.
Until startup work finishes, both answer 503 with ``Retry-After``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from vllm.entrypoints.serve.utils.api_utils import with_cancellation
from vllm.logger import init_logger

from .errors import DecisionError, NotReadyError
from .service import DecisionService
from .wire import jev, openai
from .wire.validation import location

logger = init_logger(__name__)

LATENCY_HEADER = "x-decision-latency-ms"


def openai_error(exc: DecisionError) -> JSONResponse:
    status = HTTPStatus(exc.status)
    kind = "".join(word.capitalize() for word in status.phrase.split()) + "Error"
    content = {"error": {"message": exc.message, "type": kind, "param": None, "code": status.value}}
    return JSONResponse(content, status_code=status.value)


def jev_error(exc: DecisionError) -> JSONResponse:
    if isinstance(exc, jev.JevValidationError):
        return JSONResponse({"detail": exc.detail}, status_code=HTTPStatus.UNPROCESSABLE_ENTITY)
    if exc.status == HTTPStatus.BAD_REQUEST:
        return jev_error(jev.JevValidationError.at((), exc.message))
    return JSONResponse({"detail": exc.message}, status_code=exc.status)


def body_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """FastAPI's own body errors (malformed JSON, missing body), reduced to JSON-safe fields."""
    return [
        {"loc": list(e.get("loc", ("body",))), "msg": str(e.get("msg", e)), "type": str(e.get("type", "value_error"))}
        if isinstance(e, dict)
        else {"loc": ["body"], "msg": str(e), "type": "value_error"}
        for e in exc.errors()
    ]


def decision_route(render_error: Callable[[DecisionError], JSONResponse]) -> type[APIRoute]:
    """A route class that renders every failure in one wire format and times the request."""

    class DecisionRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handle = super().get_route_handler()

            async def timed(request: Request) -> Response:
                started = time.perf_counter()
                try:
                    response = await handle(request)
                except RequestValidationError as exc:
                    errors = body_errors(exc)
                    if render_error is jev_error:
                        response = jev_error(jev.JevValidationError(errors))
                    else:
                        message = "; ".join(f"{location(tuple(e['loc'][1:]))}: {e['msg']}" for e in errors)
                        response = render_error(DecisionError(f"invalid request body: {message}"))
                except DecisionError as exc:
                    response = render_error(exc)
                    if isinstance(exc, NotReadyError):
                        response.headers["Retry-After"] = str(NotReadyError.RETRY_AFTER_S)
                response.headers[LATENCY_HEADER] = f"{(time.perf_counter() - started) * 1000:.1f}"
                return response

            return timed

    return DecisionRoute


openai_router = APIRouter(route_class=decision_route(openai_error))
jev_router = APIRouter(route_class=decision_route(jev_error))


def service_of(raw_request: Request) -> DecisionService:
    service = getattr(raw_request.app.state, "decision_service", None)
    if service is None:
        raise NotReadyError()
    return service


def request_id() -> str:
    return f"decision-{uuid.uuid4().hex}"


@openai_router.post("/v1/decisions")
@with_cancellation
async def create_decisions(body: Annotated[Any, Body()], raw_request: Request) -> Response:
    return JSONResponse(await openai.create_decision(service_of(raw_request), body, request_id()))


@jev_router.post("/v1/systemone")
@jev_router.post("/api/alpha/decisions")
@with_cancellation
async def create_systemone(body: Annotated[Any, Body()], raw_request: Request) -> Response:
    return JSONResponse(await jev.create_systemone(service_of(raw_request), body, request_id()))


def register_decisions_api_router(app: FastAPI) -> None:
    app.include_router(openai_router)
    app.include_router(jev_router)
