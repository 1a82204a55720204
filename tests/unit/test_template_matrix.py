"""The template matrix at the tokenizer level: every family's decision prompt as vLLM renders it for the
server (its renderer, no engine): where the instructions go, what closes the template's open ending, the
option letters as single tokens at the answer slot, which questions get the words layout, the stencil's
token equality with full rendering, no reasoning block left open, and the prompt itself in both layouts
pinned byte for byte (tests/golden/templates-*.json).

Regenerate the pinned prompts with ``python -m tests.unit.test_template_matrix`` and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import ANSWER_CUE
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    RENDER_VERSION,
    SYSTEM_PROMPT,
)

from ..conftest import ROOT
from ..templates.families import FAMILIES, Family
from ..templates.matrix import prompt_checks, renderer_host

GOLDEN = ROOT / "tests" / "golden" / f"templates-{RENDER_VERSION}.json"
# What each family's template does with the decision prompt: instructions in a system message or not, what
# the answer slot appends to close the ending the template leaves open, and whether the state renders once
# per request (the stencil).
EXPECTED = {
    "llama3": (True, "", True),
    "qwen3": (
        True,
        "",
        True,
    ),  # enable_thinking=False: the template closes an empty block itself
    "deepseek-r1": (True, "</think>\n", True),  # the generation prompt opens <think>
    "gemma2": (False, "", True),  # the template refuses a system role
    "gemma3": (
        True,
        "",
        True,
    ),  # the template folds the system message into the user turn
    "phi4": (True, "", True),
    "mistral-v7": (
        True,
        "",
        False,
    ),  # mistral_common renders token ids, not text: rendered per question
    "gpt-oss": (
        True,
        "<|channel|>final<|message|>",
        True,
    ),  # harmony: the final channel, no analysis
    "granite": (True, "", True),
    "smollm3": (
        True,
        "",
        True,
    ),  # enable_thinking=False (/no_think): an empty think block
    "glm4": (True, "", True),
}

# The layout a read asking for words gets for a yes/no question, a 9-level score and a choice of short values
# (matrix.WORD_QUESTIONS): words on every family's real tokenizer; the tiny local tokenizers (Granite's and
# GLM-4's test checkpoints) keep " 1" whole but not " Yes" or " billing", so those fall back to letters.
WORDS = {family.name: ("words", "words", "words") for family in FAMILIES} | {
    "granite": ("markers", "words", "markers"),
    "glm4": ("markers", "words", "markers"),
}


def checks(family: Family):
    return asyncio.run(prompt_checks(renderer_host(family)))


def pinned_prompts() -> dict[str, dict]:
    """Each family's pinned decision prompt: its text and its length in tokens."""
    assert GOLDEN.exists(), (
        f"no pinned prompts for {RENDER_VERSION}: run python -m tests.unit.test_template_matrix"
    )
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def pinned() -> dict[str, dict]:
    return pinned_prompts()


def test_every_family_has_an_expectation():
    assert set(EXPECTED) == {f.name for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_decision_prompt_on_each_family(family, pinned):
    found = checks(family)
    assert (found.system_role, found.closing, found.stencil) == EXPECTED[family.name]
    assert SYSTEM_PROMPT in found.prompt and found.prompt.endswith(ANSWER_CUE)
    # thinking is off or closed: no reasoning block is left open before the answer
    if family.reasoning:
        opener, closer = family.reasoning
        assert found.prompt.count(opener) == found.prompt.count(closer)
    assert found.markers == 26
    assert found.word_layouts == WORDS[family.name]
    assert pins(found) == pinned[family.name]


def pins(found) -> dict:
    return {
        "prompt": found.prompt,
        "tokens": found.prompt_tokens,
        "words_prompt": found.words_prompt,
        "words_tokens": found.words_prompt_tokens,
    }


if __name__ == "__main__":
    found = {f.name: checks(f) for f in FAMILIES}
    pinned_now = {name: pins(c) for name, c in found.items()}
    GOLDEN.write_text(json.dumps(pinned_now, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
