# SPDX-License-Identifier: Apache-2.0
"""Routes of the decision endpoints.

``/v1/decisions`` reports errors in vLLM's OpenAI error shape. ``/v1/systemone`` (also at
``/api/alpha/decisions``) reports validation errors as 422 ``detail`` lists, as Jev clients expect,
and other errors as ``{"detail": message}``. ``GET /v1/models`` gains a ``models`` list, the shape
the TypeSafe SDK reads, beside OpenAI's ``data``.
"""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from vllm.entrypoints.serve.utils.api_utils import with_cancellation

from .errors import DecisionError, NotReadyError
from .openapi import document_request_bodies
from .routing import decision_route
from .service import DecisionService
from .validation import detail_message
from .wire import jev, openai


def openai_error(exc: DecisionError, body_errors: list[dict[str, Any]] | None) -> JSONResponse:
    message = exc.message
    if body_errors:
        message = "invalid request body: " + detail_message(body_errors)
    status = HTTPStatus(exc.status)
    kind = "".join(word.capitalize() for word in status.phrase.split()) + "Error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status.value}}, status.value
    )


def jev_error(exc: DecisionError, body_errors: list[dict[str, Any]] | None) -> JSONResponse:
    if body_errors:
        exc = jev.JevValidationError(body_errors)
    if isinstance(exc, jev.JevValidationError):
        return JSONResponse({"detail": exc.detail}, HTTPStatus.UNPROCESSABLE_ENTITY)
    if exc.status == HTTPStatus.BAD_REQUEST:
        return jev_error(jev.JevValidationError.at((), exc.message), None)
    return JSONResponse({"detail": exc.message}, exc.status)


openai_router = APIRouter(route_class=decision_route(openai_error))
jev_router = APIRouter(route_class=decision_route(jev_error))
models_router = APIRouter()


def service_of(raw_request: Request) -> DecisionService:
    service = getattr(raw_request.app.state, "decision_service", None)
    if service is None:
        raise NotReadyError()
    return service


def request_id() -> str:
    return f"decision-{uuid.uuid4().hex}"


@openai_router.post("/v1/decisions")
@with_cancellation
async def create_decisions(raw_request: Request) -> Response:
    body = raw_request.state.decision_body  # parsed by the route class (routing.decoded)
    return JSONResponse(await openai.create_decision(service_of(raw_request), body, request_id()))


@jev_router.post("/v1/systemone")
@jev_router.post("/api/alpha/decisions")
@with_cancellation
async def create_systemone(raw_request: Request) -> Response:
    body = raw_request.state.decision_body
    return JSONResponse(await jev.create_systemone(service_of(raw_request), body, request_id()))


SERVING_SINCE = time.strftime("%Y-%m-%d", time.gmtime())


@models_router.get("/v1/models")
async def list_models(raw_request: Request) -> Response:
    """vLLM's model list, plus the same models as ``{name, description, release_date}``.

    vLLM does not know a model's release date; ``release_date`` is the day this server started.
    """
    listing = (await raw_request.app.state.openai_serving_models.show_available_models()).model_dump()
    listing["models"] = [
        {
            "name": card["id"],
            "description": f"served by vLLM with typed decisions (max_model_len {card.get('max_model_len')})",
            "release_date": SERVING_SINCE,
        }
        for card in listing["data"]
    ]
    return JSONResponse(listing)


def register_decisions_api_router(app: FastAPI) -> None:
    app.include_router(openai_router)
    app.include_router(jev_router)
    document_request_bodies(app)
    # vLLM registered its own GET /v1/models earlier; ours must come first to be the one that answers.
    app.include_router(models_router)
    ours = app.router.routes[-len(models_router.routes) :]
    del app.router.routes[-len(models_router.routes) :]
    app.router.routes[0:0] = ours
