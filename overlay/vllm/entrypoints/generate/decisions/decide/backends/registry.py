# SPDX-License-Identifier: Apache-2.0
"""The registered backends and question types, which are built in, and plugins that failed to load.

A name is taken once unless ``override=True``, so a plugin replaces a built-in only on purpose, and then
everywhere. Built-ins are known by identity, not name: a plugin type that replaced ``choice`` gets a
plugin's answer shape."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from vllm.entrypoints.generate.decisions.decide.backends import (
    BUILT_IN,
    DecisionBackend,
    built_in_backend,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    QuestionType,
)
from vllm.entrypoints.generate.decisions.decide.settings import (
    PREFIX,
    BackendSpec,
    SettingsError,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

# Names OpenAI's format gives a meaning of its own; no plugin may take them.
RESERVED_TYPE_NAMES = frozenset({"predicate", "refusal"})
# The backend served when none is configured and none claims the model's architecture.
DEFAULT_BACKEND = "logit"

B = TypeVar("B", bound=type[DecisionBackend[Any]])
P = ParamSpec("P")
R = TypeVar("R")


class Registry:
    """Backends and question types by name, the built-ins among them, and plugins that failed."""

    def __init__(self) -> None:
        # None: a built-in backend not imported yet.
        self._backends: dict[str, type[DecisionBackend] | None] = {}
        self._built_in_backends: set[str] = set()
        self._question_types: dict[str, QuestionType] = {}
        self._built_in_types: dict[str, QuestionType] = {}
        # Plugins that failed to load, by entry-point name: why.
        self._failures: dict[str, str] = {}

    @classmethod
    def with_built_ins(cls) -> Registry:
        registry = cls()
        registry._backends = dict.fromkeys(BUILT_IN)
        registry._built_in_backends = set(BUILT_IN)
        registry._built_in_types = {t.name: t for t in (NOUL, CHOICE, SCORE)}
        registry._question_types = dict(registry._built_in_types)
        return registry

    # --- backends -----------------------------------------------------------------------------

    def register_backend(self, cls: B, *, override: bool = False) -> B:
        if not (isinstance(cls, type) and issubclass(cls, DecisionBackend)):
            raise TypeError(
                f"a backend must be a DecisionBackend subclass, not {cls!r}"
            )
        name = class_name(cls, "backend")
        if name in self._backends and not override:
            current = self.backend_class(name)
            if current is not cls:
                raise ValueError(
                    f"backend name {name!r} is already taken by {self._describe(current)}; "
                    "register with override=True to replace it on purpose"
                )
        if cls.legacy_read:  # Python hides the class's DeprecationWarning by default: the operator reads this
            logger.warning(
                "decision backend %r implements the deprecated read(state, question, request_id, "
                "options); it works, but should move to read(question, context) "
                "(docs/plugins.md)",
                name,
            )
        self._backends[name] = cls
        return cls

    def unregister_backend(self, name: str) -> None:
        """Take a plugin backend out again (tests): a built-in it replaced comes back."""
        if name not in self._built_in_backends:
            self._backends.pop(name, None)
        elif not self.is_built_in_backend(self._backends[name]):
            self._backends[name] = None

    def backend_names(self) -> list[str]:
        return sorted(self._backends)

    def backend_class(self, name: str) -> type[DecisionBackend] | None:
        if name not in self._backends:
            return None
        cls = self._backends[name]
        if cls is None:
            cls = self._backends[name] = built_in_backend(name)
        return cls

    def is_built_in_backend(self, cls: type[DecisionBackend] | None) -> bool:
        name = getattr(cls, "name", None)
        return name in self._built_in_backends and built_in_backend(name) is cls

    def choose_backend(
        self, spec: BackendSpec, architectures: tuple[str, ...]
    ) -> type[DecisionBackend]:
        """The configured backend, else one claiming the architecture (plugins first), else ``logit``."""
        if spec.name:
            chosen = self.backend_class(spec.name)
            if chosen is None:
                raise SettingsError(
                    f"{PREFIX}BACKEND={spec.name!r}: unknown backend; registered: "
                    f"{', '.join(self.backend_names())}" + self.failures_detail()
                )
            return chosen
        # Every built-in is imported here: its architectures are on its class.
        classes = [self.backend_class(name) for name in list(self._backends)]
        claimants = [
            c
            for c in classes
            if c is not None and set(c.architectures) & set(architectures)
        ]
        claimants.sort(key=self.is_built_in_backend)
        default = claimants[0] if claimants else self.backend_class(DEFAULT_BACKEND)
        if default is None:
            raise SettingsError(
                f"{PREFIX}BACKEND: none set, and no backend named {DEFAULT_BACKEND!r} is registered"
            )
        return default

    def _describe(self, cls: type[DecisionBackend] | None) -> str:
        where = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else "?"
        return f"the built-in {where}" if self.is_built_in_backend(cls) else where

    # --- question types -----------------------------------------------------------------------

    def register_question_type(
        self, qtype: QuestionType | type[QuestionType], *, override: bool = False
    ) -> QuestionType:
        """Make a question type available on both endpoints; returns the registered instance."""
        kind = qtype if isinstance(qtype, type) else type(qtype)
        if not issubclass(kind, QuestionType):
            raise TypeError(
                f"a question type must be a QuestionType subclass or instance, not {qtype!r}"
            )
        name = class_name(kind, "question type")
        if name in RESERVED_TYPE_NAMES:
            raise ValueError(
                f"question type name {name!r} is reserved by OpenAI's format"
            )
        current = self._question_types.get(name)
        if current is not None and (current is qtype or type(current) is kind):
            return current
        if current is not None and not override:
            built_in = "the built-in " if self.built_in_question_type(current) else ""
            raise ValueError(
                f"question type name {name!r} is already taken by {built_in}{type(current).__qualname__}; "
                "register with override=True to replace it on purpose"
            )
        instance = qtype() if isinstance(qtype, type) else qtype
        self._question_types[name] = instance
        return instance

    def question_type(self, name: str) -> QuestionType | None:
        return self._question_types.get(name)

    def question_type_names(self) -> list[str]:
        return sorted(self._question_types)

    def built_in_question_type(self, qtype: str | QuestionType) -> bool:
        """Whether a type (or the one registered under a name) is a built-in one as shipped: each wire
        has its own answer shape for those."""
        found = self._question_types.get(qtype) if isinstance(qtype, str) else qtype
        return found is not None and self._built_in_types.get(found.name) is found

    # --- plugins that failed ------------------------------------------------------------------

    def record_failure(self, name: str, why: str) -> None:
        self._failures[name] = why

    def failures(self) -> dict[str, str]:
        return dict(self._failures)

    def failures_detail(self) -> str:
        """:meth:`failures_note` with each plugin's reason, for the operator's eyes only."""
        if not self._failures:
            return ""
        return "; plugins that failed to load: " + ", ".join(
            f"{n} ({why})" for n, why in self._failures.items()
        )

    def failures_note(self) -> str:
        """A clause for refusals a failed plugin might explain: names only (the reasons may hold paths)."""
        if not self._failures:
            return ""
        return f"; plugins that failed to load (the server's log says why): {', '.join(self._failures)}"


def class_name(cls: type, what: str) -> str:
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{what} {cls.__qualname__} sets no name (the class attribute `name`)"
        )
    return name


REGISTRY = Registry.with_built_ins()


def backend_options(cls: type[DecisionBackend], args: Mapping[str, Any]) -> Any:
    if cls.options_model is None:
        if args:
            raise SettingsError(
                f"{PREFIX}BACKEND: backend {cls.name!r} takes no arguments, got {sorted(args)}"
            )
        return None
    try:
        return cls.options_model(**args)
    except ValueError as exc:
        raise SettingsError(
            f"{PREFIX}BACKEND: bad arguments for backend {cls.name!r}: {exc}"
        ) from None


# --- the server registry's operations, as functions (the plugin API) ------------------------------


@overload
def register_backend(cls: B, /, *, override: bool = False) -> B: ...
@overload
def register_backend(
    cls: None = None, /, *, override: bool = False
) -> Callable[[B], B]: ...
def register_backend(
    cls: B | None = None, /, *, override: bool = False
) -> B | Callable[[B], B]:
    """Make a backend selectable by name; also a class decorator, with or without ``override``."""
    if cls is None:
        return lambda later: REGISTRY.register_backend(later, override=override)
    return REGISTRY.register_backend(cls, override=override)


@overload
def register_question_type(
    qtype: QuestionType | type[QuestionType], /, *, override: bool = False
) -> QuestionType: ...
@overload
def register_question_type(
    qtype: None = None, /, *, override: bool = False
) -> Callable[[QuestionType | type[QuestionType]], QuestionType]: ...
def register_question_type(
    qtype: QuestionType | type[QuestionType] | None = None, /, *, override: bool = False
) -> QuestionType | Callable[[QuestionType | type[QuestionType]], QuestionType]:
    """Make a question type available; also a class decorator, with or without ``override``."""
    if qtype is None:
        return lambda later: REGISTRY.register_question_type(later, override=override)
    return REGISTRY.register_question_type(qtype, override=override)


def _on_registry(method: Callable[Concatenate[Registry, P], R]) -> Callable[P, R]:
    """``method`` called on :data:`REGISTRY` as it is at the call (tests swap it)."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return method(REGISTRY, *args, **kwargs)

    return call


unregister_backend = _on_registry(Registry.unregister_backend)
backend_names = _on_registry(Registry.backend_names)
backend_class = _on_registry(Registry.backend_class)
choose_backend = _on_registry(Registry.choose_backend)
question_type = _on_registry(Registry.question_type)
question_type_names = _on_registry(Registry.question_type_names)
built_in_question_type = _on_registry(Registry.built_in_question_type)
record_failure = _on_registry(Registry.record_failure)
failures_note = _on_registry(Registry.failures_note)
