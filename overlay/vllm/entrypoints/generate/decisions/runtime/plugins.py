# SPDX-License-Identifier: Apache-2.0
"""Plugins from installed packages' entry points, loaded once at startup into the registry. One that
fails to load is left out, never silently: the log names it and why, as does every refusal needing it."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import ModuleType

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.backends.registry import (
    record_failure,
    register_backend,
    register_question_type,
)
from vllm.entrypoints.generate.decisions.decide.questions import QuestionType
from vllm.logger import init_logger

logger = init_logger(__name__)

BACKENDS, QUESTION_TYPES = "vllm.decision_backends", "vllm.decision_question_types"
GROUPS = {BACKENDS: "backend", QUESTION_TYPES: "question type"}
# What each group's entry points may name: the failure for anything else says so.
ACCEPTED = {
    BACKENDS: "a DecisionBackend subclass, a function that registers, or a module that registers on import",
    QUESTION_TYPES: "a QuestionType subclass or instance, a function that registers, or a module that registers "
    "on import",
}


def load_plugins() -> list[str]:
    loaded = []
    for group in GROUPS:
        for point in entry_points(group=group):
            try:
                register_target(group, point.load())
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                record_failure(point.name, reason)
                logger.error(
                    "decision plugin %r (%s, %s) failed to load and is left out: %s",
                    point.name,
                    point.value,
                    group,
                    reason,
                )
                continue
            loaded.append(f"{GROUPS[group]} {point.name}")
    if loaded:
        logger.info("decision plugins loaded: %s", ", ".join(loaded))
    return loaded


def register_target(group: str, target: object) -> None:
    if (
        group == BACKENDS
        and isinstance(target, type)
        and issubclass(target, DecisionBackend)
    ):
        register_backend(target)
    elif group == QUESTION_TYPES and (
        isinstance(target, QuestionType)
        or (isinstance(target, type) and issubclass(target, QuestionType))
    ):
        register_question_type(target)
    elif callable(target) and not isinstance(target, type):
        target()
    # a module passes: importing it registered what it has (decorators)
    elif not isinstance(target, ModuleType):
        raise TypeError(
            f"a {GROUPS[group]} entry point must name {ACCEPTED[group]}, not {described(target)}"
        )


def described(target: object) -> str:
    if isinstance(target, type):
        return f"the class {target.__module__}.{target.__qualname__}"
    return f"{type(target).__name__} {str(target)[:60]!r}"
