# SPDX-License-Identifier: Apache-2.0
"""Pydantic validation errors as messages that name the offending field."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def location(loc: tuple[Any, ...], prefix: str = "") -> str:
    """``("questions", 0, "choices")`` -> ``questions[0].choices``."""
    text = prefix
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def validation_message(exc: ValidationError, prefix: str = "") -> str:
    """All errors of ``exc``, one ``field: message`` each, joined by ``; ``."""
    parts = []
    for error in exc.errors(include_url=False):
        # Tagged unions add the tag to the location; it names no field of the request.
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith(("function-", "str", "list["))))
        parts.append(f"{location(loc, prefix)}: {error['msg']}")
    return "; ".join(parts)
