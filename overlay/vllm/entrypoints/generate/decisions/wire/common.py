# SPDX-License-Identifier: Apache-2.0
"""Pieces both wire formats share: the ``extra`` request block, detail trimming, JSON-safe numbers."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..questions import CompiledQuestion
from ..service import Answer, Decision, DecisionService
from ..settings import parse_debias

Detail = Literal["none", "basic", "full"]


class ExtraRequest(BaseModel):
    """Everything a decision request can ask for that neither wire format has a field for."""

    model_config = ConfigDict(extra="forbid")

    calibration_temperature: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    backend: str | None = None
    backend_options: dict[str, Any] | None = None
    seed: int | None = None
    detail: Detail = "full"
    # off | rotate | rotate:N (debias.py); unset: the server's VLLM_TYPED_DECISIONS_DEBIAS.
    debias: str | None = Field(default=None, pattern=r"^(off|rotate(:[1-9][0-9]*)?)$")


async def decide(
    service: DecisionService,
    extra: ExtraRequest,
    state: str,
    questions: list[CompiledQuestion],
    where: list[str],
    request_id: str,
) -> Decision:
    """The decision for a parsed request; when no question could be answered, its first failure.
    ``where`` names each question in the request, for error messages."""
    decision = await service.decide(
        state,
        questions,
        request_id,
        extra.calibration_temperature,
        where,
        backend_options=extra.backend_options,
        backend=extra.backend,
        seed=extra.seed,
        debias=parse_debias(extra.debias) if extra.debias is not None else None,
    )
    if (failure := decision.first_failure()) is not None:
        raise failure
    return decision


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such a number is reported as null."""
    return value if value is not None and math.isfinite(value) else None


def answer_extra(answer: Answer, detail: Detail) -> dict[str, Any] | None:
    if detail == "none":
        return None
    basic = detail == "basic"
    backend = answer.backend.as_json(basic)
    backend["option_logits"] = {k: finite(v) for k, v in backend["option_logits"].items()}
    return {"backend": backend, "audit": answer.audit.as_json(basic)}


def response_id(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex}", int(time.time())
