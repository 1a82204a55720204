# SPDX-License-Identifier: Apache-2.0
"""The backend registry and the startup choice of a default backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..settings import PREFIX, BackendSpec, SettingsError
from .base import DecisionBackend, Reading
from .canvas import CanvasBackend
from .encoder import EncoderBackend
from .logit import LogitBackend

_BACKENDS: dict[str, type[DecisionBackend]] = {}
_BUILT_IN: set[str] = set()


def register_backend(cls: type[DecisionBackend]) -> type[DecisionBackend]:
    """Make a backend selectable by name (usable as a class decorator)."""
    _BACKENDS[cls.name] = cls
    return cls


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def get_backend_class(name: str) -> type[DecisionBackend] | None:
    return _BACKENDS.get(name)


def choose_backend(spec: BackendSpec, architectures: tuple[str, ...]) -> type[DecisionBackend]:
    """The configured backend, else one claiming the model's architecture (plugins first), else logit."""
    if spec.name:
        cls = _BACKENDS.get(spec.name)
        if cls is None:
            from ..plugins import failures_note

            raise SettingsError(
                f"{PREFIX}BACKEND={spec.name!r}: unknown backend; registered: {', '.join(backend_names())}"
                + failures_note()
            )
        return cls
    claimants = [c for c in _BACKENDS.values() if set(c.architectures) & set(architectures)]
    claimants.sort(key=lambda c: c.name in _BUILT_IN)
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


register_backend(LogitBackend)
register_backend(EncoderBackend)
register_backend(CanvasBackend)
_BUILT_IN.update(_BACKENDS)

__all__ = [
    "DecisionBackend",
    "Reading",
    "backend_names",
    "backend_options",
    "choose_backend",
    "get_backend_class",
    "register_backend",
]
