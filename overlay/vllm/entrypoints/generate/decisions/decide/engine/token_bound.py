# SPDX-License-Identifier: Apache-2.0
"""A provable bound on the characters one token can stand for, so a prompt too long for the context
is refused by its length before it is tokenized (a 150,000-character question takes a core most of a
second to tokenize, once per read).

The bound is given only where it is certain: the tokenizer never produces an unknown token (byte-level
BPE, or BPE with byte fallback), so each token spells one vocabulary entry, never shorter than its
text; and its normalizer at most composes Unicode, replaces characters with text at least as long,
prepends or lowercases. Anything else is checked after tokenizing."""

from __future__ import annotations

import json
from typing import Any

# The most characters Unicode canonical composition turns into one: the longest canonical
# decomposition of any code point (U+1FB7-style Greek with three marks). tests/unit/test_budget.py
# recomputes it from unicodedata.
COMPOSITION = 4


def normalizer_shrink(normalizer: dict[str, Any] | None) -> int | None:
    """By how much at most ``normalizer`` shortens text (1: never; None: not known to be bounded)."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return COMPOSITION
    if kind in ("Lowercase", "Prepend"):
        return 1
    if kind == "Replace":
        pattern = normalizer.get("pattern") or {}
        text = pattern.get("String") if isinstance(pattern, dict) else None
        content = normalizer.get("content")
        if isinstance(text, str) and isinstance(content, str):
            return 1 if 0 < len(text) <= len(content) else None
        return None
    if kind == "Sequence":
        shrink = 1
        for part in normalizer.get("normalizers") or ():
            step = normalizer_shrink(part)
            if step is None:
                return None
            shrink *= step
        return shrink
    return None


def never_unknown(model: dict[str, Any], pre_tokenizer: dict[str, Any] | None) -> bool:
    """Whether a BPE model can always spell text with its own entries (byte-level or byte fallback)."""
    if model.get("type") != "BPE":
        return False
    if model.get("byte_fallback"):
        return True

    def byte_level(node: dict[str, Any] | None) -> bool:
        if not node:
            return False
        if node.get("type") == "ByteLevel":
            return True
        return node.get("type") == "Sequence" and any(
            byte_level(p) for p in node.get("pretokenizers") or ()
        )

    return byte_level(pre_tokenizer)


def chars_per_token(tokenizer: Any) -> int | None:
    """The most characters one token of ``tokenizer`` can stand for (None: no sure bound)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer that can't describe itself gets no bound
        return None
    shrink = normalizer_shrink(spec.get("normalizer"))
    if (
        shrink is None
        or not never_unknown(spec.get("model") or {}, spec.get("pre_tokenizer"))
        or not vocab
    ):
        return None
    return shrink * max(len(entry) for entry in vocab)
