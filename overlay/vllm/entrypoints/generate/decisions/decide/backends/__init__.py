# SPDX-License-Identifier: Apache-2.0
"""Backends: what one is (base.py), the built-in ones, and their registry (registry.py).

Built-ins are imported on first use, so checking settings or loading plugins doesn't import them."""

from __future__ import annotations

from importlib import import_module
from typing import Any, cast

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)

# Each built-in backend's class by the name it is selected by, also the name of its subpackage.
BUILT_IN = {
    "logit": "LogitBackend",
    "encoder": "EncoderBackend",
    "canvas": "CanvasBackend",
}
SUBPACKAGES = {class_name: f".{name}" for name, class_name in BUILT_IN.items()}


def __getattr__(name: str) -> Any:
    if name in SUBPACKAGES:
        return getattr(import_module(SUBPACKAGES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def built_in_backend(name: str) -> type[DecisionBackend]:
    return cast(type[DecisionBackend], __getattr__(BUILT_IN[name]))


__all__ = [
    "BUILT_IN",
    "CanvasBackend",
    "DecisionBackend",
    "EncoderBackend",
    "LogitBackend",
    "Reading",
    "built_in_backend",
]
