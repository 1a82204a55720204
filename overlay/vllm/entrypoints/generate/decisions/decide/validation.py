# SPDX-License-Identifier: Apache-2.0
"""Pydantic validation errors as messages that name the offending field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from vllm.entrypoints.generate.decisions.decide.errors import shown

# Error types that only say "this union branch didn't match"; a deeper error says more.
BRANCH_MISMATCH = {
    "string_type",
    "list_type",
    "dict_type",
    "model_type",
    "bool_type",
    "int_type",
    "float_type",
}


def location(loc: tuple[Any, ...], prefix: str = "") -> str:
    """``("questions", 0, "choices")`` -> ``questions[0].choices``."""
    text = prefix
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "body"


def detail_message(detail: list[dict[str, Any]]) -> str:
    """FastAPI-style ``detail`` entries (``loc`` starting with "body") as one ``field: message`` text."""
    return "; ".join(f"{location(tuple(d['loc'][1:]))}: {d['msg']}" for d in detail)


def loc_part(part: Any) -> Any:
    """A client's key (an unknown field, a Jev question id) cut short: it may be megabytes long."""
    return shown(part, bare=True) if isinstance(part, str) else part


def error_msg(error: Mapping[str, Any]) -> str:
    """A pydantic error's message, with the one client value it quotes (an unknown tag) cut short."""
    msg = str(error.get("msg", ""))
    tag = (error.get("ctx") or {}).get("tag")
    if isinstance(tag, str) and (cut := shown(tag)) != repr(tag):
        msg = msg.replace(f"'{tag}'", cut)
    return msg


def is_field_name(part: Any) -> bool:
    """Union branches show up in locations as type names (``str``, ``list[TextPart]``...)."""
    return isinstance(part, int) or (
        part.isidentifier()
        and part not in {"str", "int", "float", "bool", "dict", "list"}
    )


def validation_message(
    exc: ValidationError, prefix: str = "", skip_first: bool = False
) -> str:
    """Each error as ``field: message``; branch-mismatch noise left out where a more specific error
    about the same field exists."""
    return errors_message(exc.errors(include_url=False), skip_first, prefix)


def errors_message(
    errors: Sequence[Mapping[str, Any]], skip_first: bool = False, prefix: str = ""
) -> str:
    """:func:`validation_message` for pydantic-style errors (FastAPI's, with ``skip_first``)."""
    found = []
    for error in errors:
        loc = tuple(error["loc"][1:] if skip_first else error["loc"])
        # A validator's own ValueError is the message; pydantic prefixes it with "Value error, ".
        msg = error_msg(error).removeprefix("Value error, ")
        found.append(
            (tuple(loc_part(p) for p in loc if is_field_name(p)), error["type"], msg)
        )
    specific = [e for e in found if e[1] not in BRANCH_MISMATCH]
    kept = [
        e
        for e in found
        if e[1] not in BRANCH_MISMATCH
        or not any(s[0][: len(e[0])] == e[0] for s in specific)
    ]
    lines = [f"{location(loc, prefix)}: {msg}" for loc, _, msg in kept]
    return "; ".join(dict.fromkeys(lines))
