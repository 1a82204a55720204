# SPDX-License-Identifier: Apache-2.0
"""Backends: what one is (base.py) and the built-in ones; registry.py registers and chooses them.

The built-in backends are imported on first use (``backends.LogitBackend``, or the registry looking
one up), not with this package: checking settings or loading plugins then doesn't pull in three
backends' code.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)

# Each built-in backend by the name it is selected by: its class's name and the subpackage holding it.
BUILT_IN: dict[str, tuple[str, str]] = {
    "logit": ("LogitBackend", ".logit"),
    "encoder": ("EncoderBackend", ".encoder"),
    "canvas": ("CanvasBackend", ".canvas"),
}
SUBPACKAGES = {class_name: subpackage for class_name, subpackage in BUILT_IN.values()}


def __getattr__(name: str) -> Any:
    """``LogitBackend``, ``EncoderBackend``, ``CanvasBackend``: imported when first asked for."""
    if name in SUBPACKAGES:
        return getattr(import_module(SUBPACKAGES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def built_in_backend(name: str) -> type[DecisionBackend]:
    """The built-in backend selected by ``name`` (one of :data:`BUILT_IN`), importing it if need be."""
    class_name, subpackage = BUILT_IN[name]
    cls: type[DecisionBackend] = getattr(
        import_module(subpackage, __name__), class_name
    )
    return cls


__all__ = [
    "BUILT_IN",
    "CanvasBackend",
    "DecisionBackend",
    "EncoderBackend",
    "LogitBackend",
    "Reading",
    "built_in_backend",
]
