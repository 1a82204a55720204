# SPDX-License-Identifier: Apache-2.0
"""The route of OpenAI's Decisions API: ``POST /v1/decisions``, errors in vLLM's OpenAI error shape."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.utils.api_utils import load_aware_call, with_cancellation

from ...errors import DecisionError
from ...routing import decision_route, engine_request_id
from ...validation import errors_message
from ..common import decision_service, json_response
from .protocol import DecisionsRequest, DecisionsResponse
from .serving import create_decision


def openai_error(exc: DecisionError, body_errors: list[dict[str, Any]] | None) -> Response:
    """vLLM's error response; its type named after the status (``BadRequestError``...)."""
    message = exc.message if not body_errors else "invalid request body: " + errors_message(body_errors, True)
    status = HTTPStatus(exc.status)
    kind = "".join(word.capitalize() for word in status.phrase.split()) + "Error"
    error = create_error_response(message, kind, status)
    return JSONResponse(error.model_dump(), status.value)


router = APIRouter(route_class=decision_route(openai_error))

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 413, 415, 500, 503)}


@router.post("/v1/decisions", response_model=DecisionsResponse, responses=ERRORS)
@with_cancellation
@load_aware_call
async def create_decisions(request: DecisionsRequest, raw_request: Request) -> Response:
    decision = await create_decision(decision_service(raw_request), request, engine_request_id(raw_request))
    return json_response(decision)
