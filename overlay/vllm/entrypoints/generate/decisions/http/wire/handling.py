# SPDX-License-Identifier: Apache-2.0
"""A decision request answered, whichever way it came: the HTTP route and bulk both hand a strictly
parsed JSON body to :meth:`Wire.answer`, so both validate, decide and refuse alike. Validation errors
are shaped as FastAPI's body errors (``loc`` starting with "body"), as the error renderers expect.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    internal_error,
)
from vllm.entrypoints.generate.decisions.decide.metrics import note_refusal
from vllm.entrypoints.generate.decisions.decide.serving.service import Decides
from vllm.entrypoints.generate.decisions.decide.validation import error_msg
from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass
class Reply:
    """A status and a body: the wire's response model (sent without unset fields) or an error's JSON.
    ``status_code`` is named as on a response, so metrics.observed_route counts a Reply as one."""

    status_code: int
    body: BaseModel | Any
    retry_after: int | None = None

    def json(self) -> Any:
        if isinstance(self.body, BaseModel):
            return json.loads(self.model_json())
        return self.body

    def model_json(self) -> str:
        # a NaN or infinity, which JSON lacks, as null
        return self.body.model_dump_json(exclude_unset=True)

    def response(self) -> Response:
        if isinstance(self.body, BaseModel):
            response = Response(
                self.model_json(), self.status_code, media_type="application/json"
            )
        else:
            response = JSONResponse(self.body, self.status_code)
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(self.retry_after)
        return response


# Renders a refusal in one wire's shape, with the body's validation errors if any.
ErrorRenderer = Callable[[DecisionError, list[dict[str, Any]] | None], Reply]
# A wire's serving entry: (service, validated request, engine request id) -> its response model.
Serve = Callable[[Decides, Any, str], Awaitable[BaseModel]]


def body_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors as FastAPI reports a body's, reduced to JSON-safe fields."""
    return [
        {
            "loc": ["body", *e.get("loc", ())],
            "msg": error_msg(e),
            "type": str(e.get("type", "value_error")),
        }
        for e in exc.errors(include_url=False)
    ]


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Wire:
    """One wire format, as its routes and bulk both use it."""

    paths: tuple[str, ...]
    request_model: type[BaseModel]
    serve: Serve
    render_error: ErrorRenderer
    # headers echoing the request id besides X-Request-Id
    id_headers: tuple[str, ...] = ()

    def refusal(self, exc: DecisionError) -> Reply:
        """``exc`` in this wire's error shape, counted (metrics.py)."""
        note_refusal(exc)
        return replace(self.render_error(exc, None), retry_after=exc.retry_after)

    def request_of(self, body: Any) -> BaseModel | Reply:
        """``body`` (strictly parsed JSON) as this wire's request model, or the refusal of it."""
        if body is None:  # FastAPI reports a JSON null body as a missing one
            errors = [{"loc": ["body"], "msg": "Field required", "type": "missing"}]
        else:
            try:  # from_attributes as FastAPI validates, so a body that isn't an object gets FastAPI's message
                return self.request_model.model_validate(body, from_attributes=True)
            except ValidationError as exc:
                errors = body_errors(exc)
        return self.render_error(DecisionError("invalid request body"), errors)

    async def decide(
        self,
        service: Callable[[], Decides],
        request: BaseModel | Reply,
        request_id: str,
    ) -> Reply:
        """A request from :meth:`request_of` decided (its refusal as it is); ``service`` is asked for
        here (a route's app may have none yet)."""
        if isinstance(request, Reply):
            return request
        try:
            decided = await self.serve(service(), request, request_id)
        except DecisionError as exc:
            return self.refusal(exc)
        except Exception:  # a fault: a 500 in this wire's shape, its text only in the log (under the id)
            logger.exception("decision %s failed", request_id)
            return self.render_error(internal_error(request_id), None)
        return Reply(HTTPStatus.OK.value, decided)

    async def answer(
        self, service: Callable[[], Decides], body: Any, request_id: str
    ) -> Reply:
        return await self.decide(service, self.request_of(body), request_id)
