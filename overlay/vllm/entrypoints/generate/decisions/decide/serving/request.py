# SPDX-License-Identifier: Apache-2.0
"""One decision request as the service takes it, whichever wire it came in on.

Each wire compiles its JSON into a :class:`DecisionRequest` (wire/common.py builds it from the questions
and the ``extra`` block); the service decides it and never sees a wire's JSON. Everything an answer
depends on is here, so a reader can see it in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from vllm.entrypoints.generate.decisions.decide.read_context import sha256_of

if TYPE_CHECKING:
    from vllm.entrypoints.generate.decisions.decide.prior_modes import (
        PriorSetting,
    )
    from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
    from vllm.entrypoints.generate.decisions.decide.settings import Debias

Detail = Literal["none", "basic", "full"]


@dataclass(frozen=True)
class DecisionRequest:
    """The input text (``state``) and its questions, with what the client asked of the reading.

    ``names`` say how the wire names each question in messages (``questions[0]``, ``questions.urgent``);
    ``request_id`` is the one id of this request (the client's ``X-Request-Id``, or a new one): the
    response's id and the engine's read ids (``decision-<id>-<question>...``) are made from it. The optional
    fields are the ``extra`` block's: None means the server's setting. ``model`` is the wire's ``model``
    field: the served model or one of its LoRA adapters (adapters.py); None or empty, the served model. ``cache_salt`` and ``priority`` go
    to the engine with every read, as vLLM's own APIs pass them (its prefix-cache salt; its scheduling
    priority, which needs ``--scheduling-policy priority`` when not 0).
    """

    state: str
    questions: tuple[CompiledQuestion, ...]
    names: tuple[str, ...]
    request_id: str
    model: str | None = None
    backend: str | None = None
    backend_options: Mapping[str, Any] | None = None
    seed: int | None = None
    debias: Debias | None = None
    prior: PriorSetting | None = None
    temperature: float | None = None
    detail: Detail = "full"
    cache_salt: str | None = None
    priority: int = 0
    state_sha256: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_sha256", sha256_of(self.state))
