# SPDX-License-Identifier: Apache-2.0
"""Plugins from installed packages: the ``vllm.decision_backends`` and ``vllm.decision_question_types``
entry-point groups, loaded once at startup.

An entry point may name a backend class, a question type (class or instance), or a function that
registers things itself; importing its module may also register on its own. A plugin that fails to
load stops the server with its name: silently serving without it would answer differently.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from vllm.logger import init_logger

from .backends import DecisionBackend, register_backend
from .questions import QuestionType, register_question_type
from .settings import SettingsError

logger = init_logger(__name__)

GROUPS = {"vllm.decision_backends": "backend", "vllm.decision_question_types": "question type"}


def load_plugins() -> list[str]:
    """Load every decision plugin entry point; returns their names."""
    loaded = []
    for group in GROUPS:
        for point in entry_points(group=group):
            try:
                target = point.load()
                if isinstance(target, type) and issubclass(target, DecisionBackend):
                    register_backend(target)
                elif isinstance(target, QuestionType) or (
                    isinstance(target, type) and issubclass(target, QuestionType)
                ):
                    register_question_type(target)
                elif callable(target):
                    target()
            except Exception as exc:
                raise SettingsError(
                    f"decision plugin {point.name!r} ({point.value}, {group}) failed to load: {exc}"
                ) from exc
            loaded.append(f"{GROUPS[group]} {point.name}")
    if loaded:
        logger.info("decision plugins loaded: %s", ", ".join(loaded))
    return loaded
