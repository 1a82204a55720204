# SPDX-License-Identifier: Apache-2.0
"""A provable bound on how many characters of text one token can stand for, so that a prompt too long
for the model's context is refused by its length in characters, before it is tokenized.

Tokenizing a 150,000-character question takes a CPU core a good part of a second, once per read; a
prompt of ``n`` characters needs at least ``n / bound`` tokens, so one over ``max_model_len * bound``
characters can never fit and is refused at once. The bound is only given where it is certain:

- the tokenizer never produces an unknown token (byte-level BPE, or BPE with byte fallback), so every
  token stands for the characters of one vocabulary entry, and an entry's stored form is never shorter
  than the text it stands for (a byte-level entry spells each byte as one character; ``▁`` is a space);
- its normalizer, if any, only composes or decomposes Unicode (composition merges at most
  ``COMPOSITION`` characters into one), replaces single characters with text at least as long,
  prepends, or lowercases.

Anything else (WordPiece, unigram models, whitespace-collapsing or precompiled normalizers, slow
tokenizers) gets no bound: such prompts are still checked, after tokenizing, off the event loop.
"""

from __future__ import annotations

import json
from typing import Any

# The most characters Unicode canonical composition turns into one: the longest canonical
# decomposition of any code point (U+1FB7-style Greek with three marks). tests/unit/test_budget.py
# recomputes it from unicodedata.
COMPOSITION = 4

UNICODE_NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")


def normalizer_shrink(normalizer: dict[str, Any] | None) -> int | None:
    """By how much at most ``normalizer`` shortens text (1: never), or None when it is not known to be bounded."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind in UNICODE_NORMALIZERS:
        return COMPOSITION
    if kind in ("Lowercase", "Prepend"):
        return 1
    if kind == "Replace":
        pattern = normalizer.get("pattern") or {}
        text = pattern.get("String") if isinstance(pattern, dict) else None
        content = normalizer.get("content")
        if (
            isinstance(text, str)
            and isinstance(content, str)
            and 0 < len(text) <= len(content)
        ):
            return 1
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
    """The most characters of a prompt's text one token of ``tokenizer`` can stand for (None: no sure bound)."""
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
