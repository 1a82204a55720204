# SPDX-License-Identifier: Apache-2.0
"""Pieces both wire formats share: the ``extra`` request and answer blocks, detail trimming, JSON-safe
numbers, and question schemas for the OpenAPI document."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import Request
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
)

from vllm.entrypoints.generate.decisions.decide.answers import Answer, Decision
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    built_in_question_type,
)
from vllm.entrypoints.generate.decisions.decide.errors import NotReadyError
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    PriorSetting,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.serving.request import (
    DecisionRequest,
    Detail,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import Decides
from vllm.entrypoints.generate.decisions.decide.settings import (
    DEBIAS_FORMS,
    parse_debias,
)


def salt(value: str) -> str:
    """vLLM's own rules for a prefix-cache salt (its chat and completion APIs check the same)."""
    from vllm.entrypoints.generate.base.protocol import validate_cache_salt
    from vllm.exceptions import VLLMValidationError

    try:
        validate_cache_salt(value)
    except VLLMValidationError:
        raise ValueError(
            "a cache salt is 1 to 128 characters, none of them '@', '/', '\\' or NUL"
        ) from None
    return value


# vLLM's extensions, as its own APIs take them: a salt that keeps this request's prefix-cache blocks
# apart from other salts' (and from unsalted requests'), and a scheduling priority (lower is earlier;
# anything but 0 needs vllm serve --scheduling-policy priority, which the service checks).
CacheSalt = Annotated[str, AfterValidator(salt)]
Priority = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]


def debias_text(value: str) -> str:
    """``extra.debias``: the forms VLLM_TYPED_DECISIONS_DEBIAS takes, spelled
    exactly (lower case, no spaces, N without leading zeros). The message leaves the
    value out: the field's location names it, and a body may hold megabytes of it."""
    try:
        parse_debias(value, exact=True)
    except ValueError:
        raise ValueError(f"expected {DEBIAS_FORMS}") from None
    return value


DebiasText = Annotated[
    str, AfterValidator(debias_text), Field(description=DEBIAS_FORMS)
]


class ExtraRequest(BaseModel):
    """Everything a decision request can ask for that neither wire format has a field for."""

    model_config = ConfigDict(extra="forbid")

    calibration_temperature: float | None = Field(
        default=None, gt=0, allow_inf_nan=False
    )
    backend: str | None = None
    backend_options: dict[str, Any] | None = None
    seed: int | None = None
    detail: Detail = "full"
    # reading/rotation.py; unset: the server's VLLM_TYPED_DECISIONS_DEBIAS.
    debias: DebiasText | None = None
    # prior.py; unset: the server's VLLM_TYPED_DECISIONS_PRIOR.
    prior: PriorSetting | None = None
    cache_salt: CacheSalt | None = None
    priority: Priority | None = None


def decision_request(
    extra: ExtraRequest,
    state: str,
    questions: list[CompiledQuestion],
    names: list[str],
    request_id: str,
    model: str | None = None,
) -> DecisionRequest:
    """The request the service decides: the compiled questions, named as the wire names them in messages
    (``names``), for the ``model`` it names, with the ``extra`` block's choices."""
    return DecisionRequest(
        state,
        tuple(questions),
        tuple(names),
        request_id,
        model=model,
        backend=extra.backend,
        backend_options=extra.backend_options,
        seed=extra.seed,
        debias=parse_debias(extra.debias) if extra.debias is not None else None,
        prior=extra.prior,
        temperature=extra.calibration_temperature,
        detail=extra.detail,
        cache_salt=extra.cache_salt,
        priority=extra.priority or 0,
    )


async def decide(service: Decides, request: DecisionRequest) -> Decision:
    """The decision for a compiled request; when no question could be answered, its first failure."""
    decision = await service.decide(request)
    if (failure := decision.first_failure()) is not None:
        raise failure
    return decision


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such a number is reported as null."""
    return value if value is not None and math.isfinite(value) else None


class AnswerExtra(BaseModel):
    """An answer's ``extra``: which backend answered and its raw scores (``backend``), and what produced
    the numbers (``audit``); see reports.py for the fields."""

    backend: dict[str, Any]
    audit: dict[str, Any]
    # Whether the answer clears its type's threshold, where the operator asked a precision (reports.py).
    abstention: dict[str, Any] | None = None


def answer_extra(answer: Answer, detail: Detail) -> AnswerExtra | None:
    if detail == "none":
        return None
    basic = detail == "basic"
    backend = answer.backend.as_json(basic)
    backend["option_logits"] = {
        k: finite(v) for k, v in backend["option_logits"].items()
    }
    extra = AnswerExtra(backend=backend, audit=answer.audit.as_json(basic))
    if answer.abstention is not None:
        extra.abstention = answer.abstention.model_dump()
    return extra


class WireAnswer(Protocol):
    """A wire's answer model: its ``extra`` is set when the request's detail asks."""

    extra: AnswerExtra | None


A = TypeVar("A", bound=WireAnswer)


def answer_of(
    answer: Answer,
    detail: Detail,
    shapes: Mapping[str, Callable[..., A]],
    plugin: Callable[..., A],
    *leading: Any,
) -> A:
    """``answer`` in a wire's shape: ``shapes`` has one per built-in question type,
    ``plugin`` makes a plugin type's; either is called with the wire's ``leading``
    arguments, then the answer. Its ``extra`` holds what ``detail`` asks for."""
    qtype = answer.question.qtype
    shape = shapes.get(qtype.name) if built_in_question_type(qtype) else None
    result = (shape or plugin)(*leading, answer)
    extra = answer_extra(answer, detail)
    if extra is not None:
        result.extra = extra
    return result


def decision_service(raw_request: Request) -> Decides:
    """The server's decision service; until startup has made it, the request is refused as not ready."""
    service = getattr(raw_request.app.state, "decision_service", None)
    if service is None:
        raise NotReadyError()
    return service


def response_id(prefix: str, request_id: str) -> tuple[str, int]:
    """The response's id and creation time: the request's own id under the wire's prefix
    (``decisions-<id>``), as vLLM names a chat completion ``chatcmpl-<request id>``."""
    return f"{prefix}-{request_id}", int(time.time())


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``#/$defs/...`` reference replaced by its definition (these models don't
    recurse), so it can be placed anywhere in another document."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            if reference.startswith("#/$defs/"):
                merged = {
                    **definitions[reference.removeprefix("#/$defs/")],
                    **{k: v for k, v in node.items() if k != "$ref"},
                }
                return resolve(merged)
            # A discriminator's mapping names definitions that are inlined now; the tags stay in the schemas.
            return {
                key: resolve(value)
                for key, value in node.items()
                if key not in ("$defs", "discriminator")
            }
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def schema_of(model: type[BaseModel] | TypeAdapter[Any]) -> dict[str, Any]:
    raw = (
        model.json_schema()
        if isinstance(model, TypeAdapter)
        else model.model_json_schema()
    )
    return inline(raw)
