# SPDX-License-Identifier: Apache-2.0
"""Option labels: letters (A-Z, then the pairs the tokenizer keeps as single tokens at the answer slot)
or each option's own word, where each is one token there (:func:`word_labels`)."""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vllm.entrypoints.generate.decisions.decide.questions import NOUL, CompiledQuestion

MARKERS = string.ascii_uppercase

LabelLayout = Literal["letters", "words"]
# What the words layout calls yes/no options (by key), and the most levels it numbers (digits 1-9).
YES_NO_WORDS = {"true": "Yes", "false": "No"}
MAX_NUMBERED_LEVELS = 9


def pair_candidates(markers: str) -> list[str]:
    return [a + b for a in markers for b in markers]


@dataclass(frozen=True)
class LabelCatalog:
    """The labels usable at this model's answer slot, found once at startup."""

    markers: tuple[str, ...]
    pairs: tuple[str, ...]

    @property
    def wide_capacity(self) -> int:
        return len(self.markers) + len(self.pairs)

    def labels(self, count: int) -> list[str]:
        return list((self.markers + self.pairs)[:count])

    @staticmethod
    def layout(labels: Sequence[str]) -> str:
        return (
            "markers" if all(len(label) == 1 for label in labels) else "markers+pairs"
        )


def word_labels(question: CompiledQuestion) -> list[str] | None:
    """Each option's word, in the order listed: Yes and No, a level's number (1: the lowest, wherever it
    is listed) or the option's own label; None where they are not distinct words (then: letters)."""
    options = question.options
    if question.qtype.name == NOUL.name:
        words = [YES_NO_WORDS.get(option.key, "") for option in options]
    elif question.qtype.ordered:
        if len(options) > MAX_NUMBERED_LEVELS:
            return None
        keys = [option.key for option in options]
        # A score's keys are its level indices; an ordered plugin type's may be anything: numbered as listed.
        levels = (
            [int(k) for k in keys]
            if sorted(keys) == [str(i) for i in range(len(keys))]
            else range(len(keys))
        )
        words = [str(level + 1) for level in levels]
    else:
        words = [option.label for option in options]
    if len(set(words)) != len(words) or any(not w or w != w.strip() for w in words):
        return None
    return words
