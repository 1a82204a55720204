# SPDX-License-Identifier: Apache-2.0
"""The route of OpenAI's Decisions API: ``POST /v1/decisions``, errors in vLLM's OpenAI error shape."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from vllm.entrypoints.generate.decisions.decide import paths
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.validation import errors_message
from vllm.entrypoints.generate.decisions.http.wire.decision_route import (
    decision_route,
    respond,
)
from vllm.entrypoints.generate.decisions.http.wire.handling import Reply, Wire
from vllm.entrypoints.generate.decisions.http.wire.openai.protocol import (
    DecisionsRequest,
    DecisionsResponse,
)
from vllm.entrypoints.generate.decisions.http.wire.openai.serving import create_decision
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.exception_handling.error_response import (
    create_error_response,
)


def openai_error(exc: DecisionError, body_errors: list[dict[str, Any]] | None) -> Reply:
    """vLLM's error response; its type named after the status (``BadRequestError``...)."""
    message = (
        exc.message
        if not body_errors
        else "invalid request body: " + errors_message(body_errors, True)
    )
    status = HTTPStatus(exc.status)
    kind = "".join(word.capitalize() for word in status.phrase.split()) + "Error"
    error = create_error_response(message, kind, status, exc.param)
    return Reply(status.value, error.model_dump(mode="json"))


OPENAI = Wire(
    paths=(paths.DECISIONS,),
    request_model=DecisionsRequest,
    serve=create_decision,
    render_error=openai_error,
)

router = APIRouter(route_class=decision_route(OPENAI))

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 408, 413, 415, 500, 503)
}


@router.post(paths.DECISIONS, response_model=DecisionsResponse, responses=ERRORS)
async def create_decisions(raw_request: Request) -> Response:
    return await respond(OPENAI, raw_request)
