# SPDX-License-Identifier: Apache-2.0
"""The routes of Jev's System One API (``POST /v1/systemone``, ``/api/alpha/decisions``): a broken
request is a 422 with FastAPI-style ``detail`` entries, any other error
``{"detail": {"error_type", "message"}}``."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from vllm.entrypoints.generate.decisions.decide import paths
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.http.wire.decision_route import (
    decision_route,
    respond,
)
from vllm.entrypoints.generate.decisions.http.wire.handling import Reply, Wire
from vllm.entrypoints.generate.decisions.http.wire.jev.protocol import (
    JevError,
    JevErrorDetail,
    JevValidationErrors,
    SystemOneRequest,
    SystemOneResponse,
)
from vllm.entrypoints.generate.decisions.http.wire.jev.serving import (
    JevValidationError,
    create_systemone,
)

# What Jev clients read from ``detail.error_type``, by status; other 4xx are invalid requests.
ERROR_TYPES = {
    HTTPStatus.UNAUTHORIZED: "authentication_error",
    HTTPStatus.FORBIDDEN: "permission_error",
    HTTPStatus.NOT_FOUND: "not_found_error",
    HTTPStatus.REQUEST_TIMEOUT: "request_timeout",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "request_too_large",
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    HTTPStatus.TOO_MANY_REQUESTS: "rate_limit_error",
    HTTPStatus.SERVICE_UNAVAILABLE: "service_unavailable",
}


def jev_error(exc: DecisionError, body_errors: list[dict[str, Any]] | None) -> Reply:
    if body_errors:
        exc = JevValidationError.from_errors(body_errors)
    if isinstance(exc, JevValidationError):
        return Reply(HTTPStatus.UNPROCESSABLE_ENTITY.value, {"detail": exc.detail})
    if exc.status == HTTPStatus.BAD_REQUEST:
        return jev_error(JevValidationError.at((), exc.message), None)
    kind = ERROR_TYPES.get(HTTPStatus(exc.status)) or (
        "internal_error" if exc.status >= 500 else "invalid_request_error"
    )
    body = JevError(detail=JevErrorDetail(error_type=kind, message=exc.message))
    return Reply(HTTPStatus(exc.status).value, body.model_dump(mode="json"))


# The Jev SDK reports a failed request's id from this header.
JEV = Wire(
    paths=(paths.SYSTEMONE, paths.SYSTEMONE_ALPHA),
    request_model=SystemOneRequest,
    serve=create_systemone,
    render_error=jev_error,
    id_headers=("x-typesafe-request-id",),
)

router = APIRouter(route_class=decision_route(JEV))

ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": JevValidationErrors},
    **{code: {"model": JevError} for code in (401, 408, 413, 415, 500, 503)},
}


@router.post(paths.SYSTEMONE, response_model=SystemOneResponse, responses=ERRORS)
@router.post(
    paths.SYSTEMONE_ALPHA,
    response_model=SystemOneResponse,
    responses=ERRORS,
    operation_id="create_systemone_decisions_alpha",
)
async def create_systemone_decisions(raw_request: Request) -> Response:
    return await respond(JEV, raw_request)
