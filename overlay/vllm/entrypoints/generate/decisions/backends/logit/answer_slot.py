# SPDX-License-Identifier: Apache-2.0
"""Where the model's next token is its answer, and which token each option label is there.

The rendered chat prompt ends on the assistant's turn. We add a short answer cue to the last
plain-text run (the text after the last special token) and re-tokenize that run, so the cue joins
the prompt exactly as the tokenizer would have produced it. A label is read at the token that
follows the cue: it must be a single token that leaves the prompt's tokens unchanged and decodes
back to the label, or the question is refused (reading a different token would report the wrong
probability).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import DecisionError
from ...host import BackendHost

ANSWER_CUE = "Answer:"


@dataclass(frozen=True)
class AnswerSlot:
    prompt_ids: list[int]
    label_ids: list[int]


class AnswerSlotPlacer:
    """Places the answer cue and finds the label tokens; label tokens are cached per prompt ending."""

    def __init__(self, host: BackendHost, cue: str = ANSWER_CUE) -> None:
        self.host = host
        self.cue = cue
        self._labels: dict[tuple[str, str], int] = {}

    def place(self, rendered_ids: Sequence[int], labels: Sequence[str]) -> AnswerSlot:
        special = self.host.special_token_ids()
        start = len(rendered_ids)
        while start > 0 and rendered_ids[start - 1] not in special:
            start -= 1
        tail_text = self.host.decode(rendered_ids[start:]) + self.cue
        tail_ids = self.host.encode(tail_text)
        label_ids = [self._label_id(tail_text, tail_ids, label) for label in labels]
        return AnswerSlot(list(rendered_ids[:start]) + tail_ids, label_ids)

    def _label_id(self, tail_text: str, tail_ids: list[int], label: str) -> int:
        key = (tail_text, label)
        if key not in self._labels:
            ids = self.host.encode(f"{tail_text} {label}")
            if len(ids) != len(tail_ids) + 1 or ids[: len(tail_ids)] != tail_ids:
                raise DecisionError(f"option label {label!r} is not a single token after the answer cue")
            if self.host.decode(ids[-1:]).strip() != label:
                raise DecisionError(f"option label {label!r} does not decode back to itself")
            self._labels[key] = ids[-1]
        return self._labels[key]
