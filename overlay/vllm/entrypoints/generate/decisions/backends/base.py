# SPDX-License-Identifier: Apache-2.0
"""What a backend is: a name, the architectures it claims, and ``read`` returning a score per option."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from ..host import BackendHost
from ..questions import CompiledQuestion


@dataclass
class Reading:
    """A backend's raw result for one question.

    ``scores`` holds one raw score per option (log-probabilities for the logit backend);
    ``meta`` lands in the answer's ``extra.backend``; the token and pass counts feed the audit.
    """

    scores: list[float]
    forward_passes: int
    input_tokens: int
    cached_input_tokens: int
    readout: str
    option_mass: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)


class DecisionBackend(ABC):
    """A way of reading a distribution over a question's options from the served model.

    Backends reach the engine only through the :class:`BackendHost` they are built with, which keeps
    them testable without an engine and independent of vLLM's internals.
    """

    name: ClassVar[str]
    # Model architectures (``config.architectures``) this backend serves by default.
    architectures: ClassVar[tuple[str, ...]] = ()
    # The pydantic model of this backend's startup arguments; unknown arguments fail at startup.
    options_model: ClassVar[type[BaseModel] | None] = None
    # Names the prompt layout, so answers and saved calibrations can say which prompt they saw.
    render_version: ClassVar[str] = "none"

    def __init__(self, host: BackendHost, options: BaseModel | None = None) -> None:
        self.host = host
        self.options = options

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Startup work done once before the first request (self-checks, caches)."""

    @abstractmethod
    async def read(self, state: str, question: CompiledQuestion, request_id: str) -> Reading:
        """Score every option of ``question`` about ``state``."""
