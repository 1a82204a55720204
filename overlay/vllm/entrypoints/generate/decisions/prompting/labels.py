# SPDX-License-Identifier: Apache-2.0
"""Option labels: one marker per option (A-Z by default), then marker pairs (AA, AB, ...) that the
tokenizer keeps as single tokens at the answer slot. How many pairs qualify depends on the tokenizer."""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

# The default markers: one capital letter per option.
MARKERS = string.ascii_uppercase


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
        return "markers" if all(len(label) == 1 for label in labels) else "markers+pairs"
