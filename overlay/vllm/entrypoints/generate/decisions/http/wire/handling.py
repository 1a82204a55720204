# SPDX-License-Identifier: Apache-2.0
"""A decision request answered, whichever way it came: the HTTP route (decision_route.py) and bulk
(bulk/in_process.py) both hand a strictly parsed JSON body to :meth:`Wire.answer`, so both validate,
decide and refuse the same way, and bulk needs no simulated HTTP request.

A :class:`Wire` describes one wire format: its paths, its request model, its serving entry and its
error renderer. Validation errors are shaped as FastAPI's body errors (``loc`` starting with "body"),
which is what the wires' error renderers expect.
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
    """What a decision request is answered: a status and a body, either the wire's response model
    (sent without its unset fields) or an error's JSON body; ``retry_after`` for temporary refusals.
    ``status_code`` is named as on a response, so metrics.observed_route counts a Reply as one."""

    status_code: int
    body: BaseModel | Any
    retry_after: int | None = None

    def json(self) -> Any:
        """The body as a client parses it (bulk's results)."""
        return (
            json.loads(self.model_json())
            if isinstance(self.body, BaseModel)
            else self.body
        )

    def model_json(self) -> str:
        """A response model as JSON text; a NaN or infinity, which JSON lacks, as null."""
        return self.body.model_dump_json(exclude_unset=True)

    def response(self) -> Response:
        """The HTTP response the route sends."""
        if isinstance(self.body, BaseModel):
            response = Response(
                self.model_json(), self.status_code, media_type="application/json"
            )
        else:
            response = JSONResponse(self.body, self.status_code)
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(self.retry_after)
        return response


# Renders a refusal in one wire's shape; the list is the body's validation errors, when there are any.
ErrorRenderer = Callable[[DecisionError, list[dict[str, Any]] | None], Reply]
# A wire's serving entry: (service, validated request, engine request id) -> its response model.
Serve = Callable[[Decides, Any, str], Awaitable[BaseModel]]


class InvalidBody(Exception):
    """The body does not validate against the wire's request model; ``errors`` as FastAPI gives them."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("invalid request body")
        self.errors = errors


def body_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors as FastAPI reports a body's, reduced to JSON-safe fields: ``loc`` starts
    with "body"."""
    return [
        {
            "loc": ["body", *e.get("loc", ())],
            "msg": error_msg(e),
            "type": str(e.get("type", "value_error")),
        }
        for e in exc.errors(include_url=False)
    ]


def validated(model: type[BaseModel], body: Any) -> BaseModel:
    """``body`` as ``model``, or :class:`InvalidBody` with the errors FastAPI would have found."""
    if body is None:  # FastAPI reports a JSON null body as a missing one
        raise InvalidBody(
            [{"loc": ["body"], "msg": "Field required", "type": "missing"}]
        )
    try:  # from_attributes as FastAPI validates, so a body that isn't an object gets FastAPI's message
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        raise InvalidBody(body_errors(exc)) from None


def new_request_id() -> str:
    """A request id for a request that came without one (no ``X-Request-Id``; each bulk line)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Wire:
    """One wire format, as its routes and bulk both use it."""

    paths: tuple[str, ...]
    request_model: type[BaseModel]
    serve: Serve
    render_error: ErrorRenderer
    id_headers: tuple[
        str, ...
    ] = ()  # headers echoing the request id besides X-Request-Id

    def refusal(self, exc: DecisionError) -> Reply:
        """``exc`` in this wire's error shape, counted by its reason (metrics.py)."""
        note_refusal(exc)
        return replace(self.render_error(exc, None), retry_after=exc.retry_after)

    def request_of(self, body: Any) -> BaseModel | Reply:
        """``body`` (strictly parsed JSON) as this wire's request model, or the refusal of it."""
        try:
            return validated(self.request_model, body)
        except InvalidBody as exc:
            return self.render_error(DecisionError("invalid request body"), exc.errors)

    async def decide(
        self, service: Callable[[], Decides], request: BaseModel, request_id: str
    ) -> Reply:
        """A valid request decided; any refusal in this wire's shape.

        ``service`` is asked for here (a route's app may have none yet: not ready). ``request_id`` is
        this request's one id: its engine reads and its response's id derive from it.
        """
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
        """``body`` (strictly parsed JSON) validated and decided, as :meth:`request_of` and
        :meth:`decide` do it."""
        request = self.request_of(body)
        if isinstance(request, Reply):
            return request
        return await self.decide(service, request, request_id)
