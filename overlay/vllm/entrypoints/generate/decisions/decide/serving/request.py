# SPDX-License-Identifier: Apache-2.0
"""One decision request as the service takes it, whichever wire it came in on (wire/common.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from vllm.entrypoints.generate.decisions.decide.read_context import sha256_of

if TYPE_CHECKING:
    from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
    from vllm.entrypoints.generate.decisions.decide.settings import Debias, PriorSetting

Detail = Literal["none", "basic", "full"]


@dataclass(frozen=True)
class DecisionRequest:
    """``names``: how the wire names each question in messages; ``request_id``: the client's
    ``X-Request-Id`` or a new one; optional fields: the ``extra`` block's (None: the server's)."""

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
