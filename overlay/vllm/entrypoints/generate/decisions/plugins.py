# SPDX-License-Identifier: Apache-2.0
"""Plugins from installed packages: the ``vllm.decision_backends`` and ``vllm.decision_question_types``
entry-point groups, loaded once at startup.

An entry point may name a backend class, a question type (class or instance), or a function that
registers things itself; importing its module may also register on its own. A plugin that fails to
load is left out, never silently: the log names it and why, and so does every refusal of a request
that needs it (and the server won't start if the configured backend was one of its).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from vllm.logger import init_logger

from .backends import DecisionBackend
from .questions import QuestionType
from .registry import record_failure, register_backend, register_question_type

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
                reason = f"{type(exc).__name__}: {exc}"
                record_failure(point.name, reason)
                logger.error("decision plugin %r (%s, %s) failed to load and is left out: %s",
                             point.name, point.value, group, reason)  # fmt: skip
                continue
            loaded.append(f"{GROUPS[group]} {point.name}")
    if loaded:
        logger.info("decision plugins loaded: %s", ", ".join(loaded))
    return loaded
