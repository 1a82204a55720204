# SPDX-License-Identifier: Apache-2.0
"""What a backend is: a name, the architectures it claims, and ``read`` returning a score per option."""

from __future__ import annotations

import inspect
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar, cast

from pydantic import BaseModel, JsonValue, ValidationError

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX, Settings
from vllm.entrypoints.generate.decisions.decide.validation import validation_message

# What a reading reports beyond its scores: a pydantic model (unset fields are not reported) or JSON.
Facts: TypeAlias = BaseModel | Mapping[str, JsonValue]


def facts_json(facts: Facts) -> dict[str, Any]:
    if isinstance(facts, BaseModel):
        return facts.model_dump(exclude_unset=True)
    return dict(facts)


@dataclass
class Reading:
    """A backend's raw result for one question: a raw score per option (log-probabilities for the
    logit backend); ``meta`` lands in the answer's ``extra.backend``, ``audit`` in its ``extra.audit``."""

    scores: list[float]
    forward_passes: int
    input_tokens: int
    cached_input_tokens: int
    readout: str
    option_mass: float | None = None
    meta: Facts = field(default_factory=dict)
    audit: Facts = field(default_factory=dict)


# A backend's options: its ``options_model`` (None for a backend that takes none).
OptionsT = TypeVar("OptionsT", bound=BaseModel | None)


class DecisionBackend(ABC, Generic[OptionsT]):
    """A way of reading a distribution over a question's options from the served model. It reaches
    the engine only through its :class:`BackendHost`: testable without an engine, apart from vLLM."""

    name: ClassVar[str]
    # Model architectures (``config.architectures``) this backend serves by default.
    architectures: ClassVar[tuple[str, ...]] = ()
    # The pydantic model of this backend's startup arguments; unknown arguments fail at startup.
    options_model: ClassVar[type[BaseModel] | None] = None
    # The pydantic model of what ``start`` returns for the other API-server processes to ``adopt``.
    facts_model: ClassVar[type[BaseModel] | None] = None
    # Names the prompt layout, so answers and saved calibrations can say which prompt they saw.
    render_version: ClassVar[str] = "none"
    # The option naming how labels are laid out (logit's ``labels``) and its values, compared by
    # startup calibration per question type.
    layout_option: ClassVar[str | None] = None
    layouts: ClassVar[tuple[str, ...]] = ()
    # Whether a reading doesn't depend on the options' order: debiasing then reads it once.
    order_independent: ClassVar[bool] = False
    # Options only startup decides (logit's ``markers``): a request naming another value is refused,
    # not silently ignored.
    startup_only: ClassVar[tuple[str, ...]] = ()
    # Set for a subclass whose ``read`` still takes ``(state, question, request_id, options)``.
    legacy_read: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.legacy_read = takes_legacy_read(cls.read)
        if cls.legacy_read:
            warnings.warn(
                f"decision backend {cls.__qualname__}: read(state, question, request_id, options) is "
                "deprecated; implement read(question, context) (docs/plugins.md)",
                DeprecationWarning,
                stacklevel=2,
            )

    def __init__(
        self,
        host: BackendHost,
        options: OptionsT | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.host = host
        # None only for a backend without options (OptionsT None); one with options fills in its defaults.
        self.options: OptionsT = cast(OptionsT, options)
        self.settings = settings or Settings.from_env({})

    def request_options(self, overrides: dict[str, Any] | None) -> OptionsT:
        """The startup options with a request's ``backend_options`` laid over them."""
        if not overrides:
            return self.options
        if self.options_model is None:
            raise DecisionError(
                f"extra.backend_options: the {self.name!r} backend takes no per-request options"
            )
        base = self.options.model_dump() if self.options is not None else {}
        try:
            options = self.options_model.model_validate({**base, **overrides})
        except ValidationError as exc:
            raise DecisionError(
                validation_message(exc, "extra.backend_options")
            ) from None
        for name in self.startup_only:
            if name in overrides and getattr(options, name) != base.get(name):
                raise DecisionError(
                    f"extra.backend_options.{name}: set at startup only ({PREFIX}BACKEND={self.name}:{name}=...); "
                    f"this server reads with {base.get(name)!r}, leave {name} out",
                    param=f"extra.backend_options.{name}",
                )
        return cast(OptionsT, options)

    def compared_layouts(self) -> tuple[str, ...]:
        """The layouts startup calibration compares, the first its baseline: none where the operator
        chose one."""
        chosen = (
            self.options is not None
            and self.layout_option in self.options.model_fields_set
        )
        return () if self.layout_option is None or chosen else self.layouts

    def with_layout(self, options: OptionsT, layout: str | None) -> OptionsT:
        if layout is None or self.layout_option is None or options is None:
            return options
        return options.model_copy(update={self.layout_option: layout})

    def seeded(self, options: OptionsT, seed: int | None) -> OptionsT:
        """``options`` for a request that sent ``extra.seed`` (for backends whose reads draw randomness)."""
        return options

    async def start(self) -> BaseModel | None:
        """Checks and preparation before the first request; raise :class:`BackendUnavailable` when this
        model can't be served (requests then get a 503 saying why). Returning a :attr:`facts_model` lets
        the other API-server processes :meth:`adopt` it instead of starting; None: each process starts."""
        return None

    def read_key(self) -> dict[str, Any]:
        """What the startup check found that changes reads (precision, say), for the saved
        calibration's key."""
        return {}

    def adopt(self, facts: Any) -> None:  # noqa: B027 - optional hook
        """Apply the facts another API-server process's :meth:`start` returned."""

    @abstractmethod
    async def read(
        self, question: CompiledQuestion, context: ReadContext[OptionsT]
    ) -> Reading:
        """Score every option of ``question`` about ``context.state``; engine reads go through the host
        with ``context`` (or ``context.part(...)`` for each of several)."""


def takes_legacy_read(read: Any) -> bool:
    """Whether ``read`` is the old ``read(self, state, question, request_id, options=None)``."""
    try:
        parameters = list(inspect.signature(read).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in parameters) > 2
