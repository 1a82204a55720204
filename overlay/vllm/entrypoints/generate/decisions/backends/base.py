# SPDX-License-Identifier: Apache-2.0
"""What a backend is: a name, the architectures it claims, and ``read`` returning a score per option."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from ..errors import DecisionError
from ..host import BackendHost
from ..questions import CompiledQuestion
from ..settings import Settings
from ..validation import validation_message


class BackendUnavailable(RuntimeError):
    """A backend can't serve the model it was started on; the message says why."""


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

    def __init__(self, host: BackendHost, options: Any = None, settings: Settings | None = None) -> None:
        self.host = host
        self.options = options
        self.settings = settings or Settings.from_env({})

    def request_options(self, overrides: dict[str, Any] | None) -> Any:
        """The startup options with a request's ``backend_options`` laid over them, validated."""
        if not overrides:
            return self.options
        if self.options_model is None:
            raise DecisionError(f"extra.backend_options: the {self.name!r} backend takes no per-request options")
        base = self.options.model_dump() if self.options is not None else {}
        try:
            return self.options_model.model_validate({**base, **overrides})
        except ValidationError as exc:
            raise DecisionError(validation_message(exc, "extra.backend_options")) from None

    def seeded(self, options: Any, seed: int | None) -> Any:
        """``options`` for a request that sent ``extra.seed``: backends whose reads draw randomness take
        it from here; the others ignore it."""
        return options

    async def start(self) -> dict[str, Any] | None:
        """The one startup hook: checks and preparation before the first request, for the default
        backend and for one a request names alike. Raise :class:`BackendUnavailable` when this model
        can't be served (requests then get a 503 saying why).

        Work worth doing once per server rather than once per API-server process (reading the model,
        say) is shared by returning what it found as JSON-able facts: the other processes of this
        server then :meth:`adopt` them instead of starting. None (the default): each process starts."""
        return None

    def adopt(self, facts: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Apply the facts another API-server process's :meth:`start` returned."""

    @abstractmethod
    async def read(self, state: str, question: CompiledQuestion, request_id: str, options: Any = None) -> Reading:
        """Score every option of ``question`` about ``state``; ``options`` are this request's
        (from :meth:`request_options`), or None for the startup options."""


def checked_scores(reading: Any, options: int, backend: str) -> list[float]:
    """A backend's scores as floats: one real number (or -inf) per option, not all -inf. Anything else
    is the backend's fault, refused for this question rather than sent on as NaN."""
    scores = getattr(reading, "scores", None)
    try:
        values = [float(score) for score in scores]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        values = None
    if values is None or len(values) != options:
        count = len(values) if values is not None else repr(scores)[:40]
        fault = f"returned {count} scores for {options} options"
    elif any(math.isnan(v) or v == math.inf for v in values):
        fault = "returned a score that is NaN or +inf"
    elif all(v == -math.inf for v in values):
        fault = "gave every option zero probability"
    else:
        return values
    raise DecisionError(f"backend {backend!r} {fault}", HTTPStatus.INTERNAL_SERVER_ERROR)
