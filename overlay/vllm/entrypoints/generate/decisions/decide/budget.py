# SPDX-License-Identifier: Apache-2.0
"""One rendering budget per request: the characters its input and questions may render to together,
each value's own limit, and how deep any JSON value in them may nest, spent while they are compiled.

A JSON value renders to indented text that grows with the square of its depth, so a 100 KB body can
ask for tens of millions of characters. A budget holds each value to MAX_INPUT_CHARS, the request as a
whole to MAX_REQUEST_CHARS and every value to MAX_JSON_DEPTH, and refuses the moment rendering crosses
them, so a refusal costs time in proportion to the bytes sent. The wires make one per request and pass
it to everything that renders the request (questions.content_text, QuestionType.compile).
"""

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
    """How deep ``value`` nests (a scalar: 0), counted without recursion and only as far as ``limit + 1``."""
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
    """Refuses a JSON value nested deeper than ``limit`` (VLLM_TYPED_DECISIONS_MAX_JSON_DEPTH)."""
    if json_depth(value, limit) > limit:
        raise OverLimitError(
            f"a JSON value in the request nests deeper than {limit} levels (set {PREFIX}MAX_JSON_DEPTH to raise it)"
        )


@dataclass
class RenderBudget:
    """What one request may still render: ``max_chars`` in all, ``max_value_chars`` from any one value,
    no JSON value deeper than ``max_depth``. The defaults are the settings' defaults."""

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
        """Counts ``chars`` more rendered characters; refuses the request once the total is over."""
        self.spent += chars
        if self.spent > self.max_chars:
            raise OverLimitError(over_request_message(self.max_chars))
