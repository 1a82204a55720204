# SPDX-License-Identifier: Apache-2.0
"""Pieces both wire formats share: the ``extra`` request and answer blocks, detail trimming, JSON-safe
numbers, and question schemas for the OpenAPI document."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
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
from vllm.entrypoints.generate.decisions.decide.concurrency import off_the_loop
from vllm.entrypoints.generate.decisions.decide.errors import NotReadyError
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    Option,
)
from vllm.entrypoints.generate.decisions.decide.serving.request import (
    DecisionRequest,
    Detail,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import Decides
from vllm.entrypoints.generate.decisions.decide.settings import (
    DEBIAS_FORMS,
    PriorSetting,
    Settings,
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


# vLLM's extensions as its own APIs take them: a prefix-cache salt, and a scheduling priority (lower is
# earlier; anything but 0 needs --scheduling-policy priority, which the service checks).
CacheSalt = Annotated[str, AfterValidator(salt)]
Priority = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]


def debias_text(value: str) -> str:
    """``extra.debias``, spelled exactly; the message leaves the value out (it may be megabytes)."""
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
    """The request the service decides; ``names``: the questions as the wire's messages name them."""
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


R = TypeVar("R")


def serving(
    compiled: Callable[[Any, str, Settings], tuple[Any, DecisionRequest]],
    response: Callable[[Any, Any, Decision, str], R],
) -> Callable[[Decides, Any, str], Awaitable[R]]:
    """A wire's serving entry: the request ``compiled`` off the event loop (rendering a large request's
    JSON must not hold up other clients), decided, and shaped by ``response``; when no question could
    be answered, the decision's first failure is raised."""

    async def serve(service: Decides, request: Any, request_id: str) -> R:
        names, asked = await off_the_loop(
            compiled, request, request_id, service.settings
        )
        decision = await service.decide(asked)
        if (failure := decision.first_failure()) is not None:
            raise failure
        return response(request, names, decision, request_id)

    return serve


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such a number is reported as null."""
    return value if value is not None and math.isfinite(value) else None


class AnswerExtra(BaseModel):
    """An answer's ``extra``; reports.py has the fields."""

    backend: dict[str, Any]
    audit: dict[str, Any]
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
    """``answer`` in a wire's shape: ``shapes[type]`` for a built-in type, else ``plugin``, called with
    ``leading`` and the answer."""
    qtype = answer.question.qtype
    shape = shapes.get(qtype.name) if built_in_question_type(qtype) else None
    result = (shape or plugin)(*leading, answer)
    if (extra := answer_extra(answer, detail)) is not None:
        result.extra = extra
    return result


def option_probabilities(answer: Answer) -> Iterator[tuple[Option, float]]:
    return zip(answer.question.options, answer.probabilities, strict=True)


def by_key(answer: Answer) -> dict[str, float]:
    return {o.key: p for o, p in option_probabilities(answer)}


def plugin_fields(answer: Answer) -> dict[str, Any]:
    """A plugin type's answer: its own fields, the confidence and (unless it has its own) the
    probabilities by option key."""
    return {
        "probabilities": by_key(answer),
        **answer.fields,
        "confidence": answer.confidence,
    }


def decision_service(raw_request: Request) -> Decides:
    if (service := getattr(raw_request.app.state, "decision_service", None)) is None:
        raise NotReadyError()
    return service


def response_id(prefix: str, request_id: str) -> tuple[str, int]:
    """The response's id and creation time: ``<prefix>-<request id>``, as vLLM's ``chatcmpl-<id>``."""
    return f"{prefix}-{request_id}", int(time.time())


def schema_of(model: type[BaseModel] | TypeAdapter[Any]) -> dict[str, Any]:
    """``model``'s schema with its ``$defs`` references inlined (these models don't recurse), to place
    anywhere."""
    if isinstance(model, TypeAdapter):
        schema = model.json_schema()
    else:
        schema = model.model_json_schema()
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
            # a discriminator's mapping names the inlined definitions; the tags stay
            return {
                key: resolve(value)
                for key, value in node.items()
                if key not in ("$defs", "discriminator")
            }
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)
