# SPDX-License-Identifier: Apache-2.0
"""Option labels, in two layouts.

- letters: one marker per option (A-Z by default), then marker pairs (AA, AB, ...) that the tokenizer
  keeps as single tokens at the answer slot. How many pairs qualify depends on the tokenizer.
- words: each option's own word (:func:`word_labels`): Yes/No, a level's number, a choice's value. A
  question uses them only where each is one token at its answer slot; otherwise it uses letters.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vllm.entrypoints.generate.decisions.decide.questions import NOUL, CompiledQuestion

# The default markers: one capital letter per option.
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
        """Labels for ``count`` options: the markers first, then pairs."""
        return list((self.markers + self.pairs)[:count])

    @staticmethod
    def layout(labels: Sequence[str]) -> str:
        return (
            "markers" if all(len(label) == 1 for label in labels) else "markers+pairs"
        )


def word_labels(question: CompiledQuestion) -> list[str] | None:
    """The words layout's label of each option of ``question`` in the order listed, or None where it
    has none (the question then uses letters). A label names its option wherever it is listed:

    - a yes/no question: ``Yes`` and ``No``;
    - an ordered question (a score's levels) of at most 9 levels: the level's number, 1 for the lowest
      (a reversed listing reads 3, 2, 1);
    - any other: each option's own short name (a choice's value as the client wrote it), when they are
      all distinct, non-empty words.
    """
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
    if any(not word or word != word.strip() for word in words) or len(
        set(words)
    ) != len(words):
        return None
    return words
