# SPDX-License-Identifier: Apache-2.0
"""The logit backend's prompt: the state first, then the criterion, then lettered options.

The state comes first so that every question about one state shares a token prefix, which vLLM's
prefix cache then prefills once. ``RENDER_VERSION`` names this exact layout; tests/golden pins it
byte for byte, so change the version whenever the text changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...questions import CompiledQuestion

RENDER_VERSION = "direct-letters-2026-11-30.1"

SYSTEM_PROMPT = (
    "You answer questions about a document. Each question lists options marked with letters. "
    "Reply with the letter of the one option that fits best, and nothing else."
)


def option_letters(count: int) -> list[str]:
    """A, B, C ... for up to 26 options."""
    if count > 26:
        raise ValueError("the direct readout has 26 letters")
    return [chr(ord("A") + i) for i in range(count)]


def question_text(question: CompiledQuestion, letters: Sequence[str]) -> str:
    lines = [f"Question: {question.instructions}".rstrip(), "", "Options:"]
    lines += [f"{letter}. {option.text}" for letter, option in zip(letters, question.options, strict=True)]
    lines += ["", f"Answer with one letter ({letters[0]}-{letters[-1]})."]
    return "\n".join(lines)


def messages(state: str, question: CompiledQuestion, letters: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages for one question; everything before the question text depends only on the state."""
    user = f"Document:\n{state}\n\n{question_text(question, letters)}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
