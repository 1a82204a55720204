# SPDX-License-Identifier: Apache-2.0
"""One rendering budget per request, spent while its input and questions are compiled.

Indented JSON grows with the square of its depth (a 100 KB body can ask for tens of millions of
characters), so rendering is refused the moment it crosses a limit, not after: a refusal costs time in
proportion to the bytes sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.entrypoints.generate.decisions.decide.errors import OverLimitError
from vllm.entrypoints.generate.decisions.decide.settings import (
    DEFAULT_MAX_INPUT_CHARS,
    DEFAULT_MAX_JSON_DEPTH,
    PREFIX,
    REQUEST_CHARS_PER_INPUT,
    Settings,
)


def over_request_message(limit: int) -> str:
    return (
        f"the request's input and questions render to more than {limit} characters of text together "
        f"(set {PREFIX}MAX_REQUEST_CHARS to raise it)"
    )


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar: 0), counted without recursion, up to ``limit + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)) or not item:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend(
            (child, depth + 1)
            for child in (item.values() if isinstance(item, dict) else item)
        )
    return deepest


def check_depth(value: Any, limit: int = DEFAULT_MAX_JSON_DEPTH) -> None:
    if json_depth(value, limit) > limit:
        raise OverLimitError(
            f"a JSON value in the request nests deeper than {limit} levels (set {PREFIX}MAX_JSON_DEPTH to raise it)"
        )


@dataclass
class RenderBudget:
    max_chars: int = REQUEST_CHARS_PER_INPUT * DEFAULT_MAX_INPUT_CHARS
    max_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_value_chars: int = DEFAULT_MAX_INPUT_CHARS
    spent: int = 0

    @classmethod
    def of(cls, settings: Settings) -> RenderBudget:
        return cls(
            settings.max_request_chars,
            settings.max_json_depth,
            settings.max_input_chars,
        )

    def charge(self, chars: int) -> None:
        self.spent += chars
        if self.spent > self.max_chars:
            raise OverLimitError(over_request_message(self.max_chars))
