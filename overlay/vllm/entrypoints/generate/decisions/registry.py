# SPDX-License-Identifier: Apache-2.0
"""What this server can answer with: the registered backends and question types, which of them are
built in, and the plugins that failed to load.

Everything that registers or looks up a backend or a question type goes through here: the built-ins
are registered when this module is imported, plugins (plugins.py) afterwards, and the wires, the
service and startup only read. A refusal that a failed plugin might explain says so
(:func:`failures_note`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .backends.base import DecisionBackend
from .backends.canvas import CanvasBackend
from .backends.encoder import EncoderBackend
from .backends.logit import LogitBackend
from .questions import CHOICE, NOUL, SCORE, QuestionType
from .settings import PREFIX, BackendSpec, SettingsError

# Names OpenAI's format gives a meaning of its own; no plugin may take them.
RESERVED_TYPE_NAMES = frozenset({"predicate", "refusal"})

_backends: dict[str, type[DecisionBackend]] = {}
_question_types: dict[str, QuestionType] = {}
_built_in: set[str] = set()
_built_in_types: set[str] = set()
# Plugins that failed to load, by entry-point name: why.
_failures: dict[str, str] = {}


# --- backends ---------------------------------------------------------------------------------


def register_backend(cls: type[DecisionBackend]) -> type[DecisionBackend]:
    """Make a backend selectable by name (usable as a class decorator)."""
    _backends[cls.name] = cls
    return cls


def unregister_backend(name: str) -> None:
    """Take a plugin backend out again (tests); built-ins stay."""
    if name not in _built_in:
        _backends.pop(name, None)


def backend_names() -> list[str]:
    return sorted(_backends)


def backend_class(name: str) -> type[DecisionBackend] | None:
    return _backends.get(name)


def choose_backend(spec: BackendSpec, architectures: tuple[str, ...]) -> type[DecisionBackend]:
    """The configured backend, else one claiming the model's architecture (plugins first), else logit."""
    if spec.name:
        cls = _backends.get(spec.name)
        if cls is None:
            raise SettingsError(
                f"{PREFIX}BACKEND={spec.name!r}: unknown backend; registered: {', '.join(backend_names())}"
                + failures_note()
            )
        return cls
    claimants = [c for c in _backends.values() if set(c.architectures) & set(architectures)]
    claimants.sort(key=lambda c: c.name in _built_in)
    return claimants[0] if claimants else LogitBackend


def backend_options(cls: type[DecisionBackend], args: Mapping[str, Any]) -> Any:
    """Validate startup arguments against the backend's options model; unknown ones fail."""
    if cls.options_model is None:
        if args:
            raise SettingsError(f"{PREFIX}BACKEND: backend {cls.name!r} takes no arguments, got {sorted(args)}")
        return None
    try:
        return cls.options_model(**args)
    except ValueError as exc:
        raise SettingsError(f"{PREFIX}BACKEND: bad arguments for backend {cls.name!r}: {exc}") from None


# --- question types ---------------------------------------------------------------------------


def register_question_type(qtype: QuestionType | type[QuestionType]) -> QuestionType:
    """Make a question type available on both endpoints. Usable as a class decorator."""
    instance = qtype() if isinstance(qtype, type) else qtype
    if instance.name in RESERVED_TYPE_NAMES:
        raise ValueError(f"question type name {instance.name!r} is reserved by OpenAI's format")
    _question_types[instance.name] = instance
    return instance


def question_type(name: str) -> QuestionType | None:
    return _question_types.get(name)


def question_type_names() -> list[str]:
    return sorted(_question_types)


def built_in_question_type(name: str) -> bool:
    """Jev's ``noul``, ``choice`` and ``score``: each wire has its own shape for them."""
    return name in _built_in_types


# --- plugins that failed ----------------------------------------------------------------------


def record_failure(name: str, why: str) -> None:
    _failures[name] = why


def failures_note() -> str:
    """A clause for refusals that might be explained by a plugin that failed to load."""
    if not _failures:
        return ""
    return "; plugins that failed to load: " + ", ".join(f"{name} ({why})" for name, why in _failures.items())


for _backend in (LogitBackend, EncoderBackend, CanvasBackend):
    register_backend(_backend)
for _qtype in (NOUL, CHOICE, SCORE):
    register_question_type(_qtype)
_built_in.update(_backends)
_built_in_types.update(_question_types)
