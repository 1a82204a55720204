# SPDX-License-Identifier: Apache-2.0
"""The decision endpoints on vLLM's app: each wire format's router, ``GET /v1/models`` with the
``models`` list the TypeSafe SDK reads, and the wire answering each decision path (:func:`wire_at`)."""

from __future__ import annotations

import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from vllm.entrypoints.generate.decisions.decide.paths import DECISION_PATHS
from vllm.entrypoints.generate.decisions.http.wire.handling import Wire
from vllm.entrypoints.generate.decisions.http.wire.jev import api_router as jev
from vllm.entrypoints.generate.decisions.http.wire.openai import api_router as openai
from vllm.logger import init_logger

logger = init_logger(__name__)

models_router = APIRouter()

SERVING_SINCE = time.strftime("%Y-%m-%d", time.gmtime())


@models_router.get("/v1/models")
async def list_models(raw_request: Request) -> Response:
    """vLLM's model list, plus ``models``; vLLM knows no release date, so it is the server's start."""
    listing = (
        await raw_request.app.state.openai_serving_models.show_available_models()
    ).model_dump()
    listing["models"] = [
        {
            "name": card["id"],
            "description": f"served by vLLM with typed decisions (max_model_len {card.get('max_model_len')})",
            "release_date": SERVING_SINCE,
        }
        for card in listing["data"]
    ]
    return JSONResponse(listing)


def wire_at(path: str) -> Wire:
    for wire in (openai.OPENAI, jev.JEV):
        if path in wire.paths:
            return wire
    raise ValueError(f"{path!r}: not a decision endpoint ({', '.join(DECISION_PATHS)})")


def take_over(app: FastAPI, router: APIRouter) -> None:
    """``router``'s routes in place of the app's for the same path and method (vLLM 0.32 answers
    ``POST /v1/systemone`` itself)."""
    ours = {
        (route.path, method)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    for route in [r for r in app.router.routes if isinstance(r, APIRoute)]:
        if taken := sorted(m for m in route.methods if (route.path, m) in ours):
            logger.info(
                "typed decisions answer %s %s in place of %s",
                "/".join(taken),
                route.path,
                route.name,
            )
            app.router.routes.remove(route)
    app.include_router(router)


def register_decisions_api_router(app: FastAPI) -> None:
    take_over(app, openai.router)
    take_over(app, jev.router)
    # vLLM registered its own GET /v1/models earlier; ours must come first to be the one that answers.
    app.include_router(models_router)
    ours = app.router.routes[-len(models_router.routes) :]
    del app.router.routes[-len(models_router.routes) :]
    app.router.routes[0:0] = ours
