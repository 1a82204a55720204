# SPDX-License-Identifier: Apache-2.0
"""Where the model's next token is its answer, and which token each option label is there.

The rendered chat prompt ends on the assistant's turn. Some templates leave something open there (a
reasoning block, an output channel): we close it. Then comes an optional empty reasoning block (chosen
by the startup self-check for models that start one by themselves) and a short answer cue. The last
plain-text run (the text after the last special token) is re-tokenized with the cue, so the prompt is
tokenized exactly as the tokenizer would have done it. A label is read at the token that follows the
cue: it must be a single token that leaves the prompt's tokens unchanged and decodes back to the label,
or the question is refused (reading a different token would report the wrong probability).

Word labels (labels.py) may instead be read after a space that ends the prompt (:meth:`place_words`):
most BPE tokenizers keep a digit apart from the space before it, so "Answer: 1" is the cue, a space,
then the digit, and the digit is read at the token after the space.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError, shown
from vllm.entrypoints.generate.decisions.decide.host import BackendHost

ANSWER_CUE = "Answer:"

# The most label tokens remembered (letters and pairs need about 700 per prompt ending; words come from
# requests, so the oldest are forgotten past this).
LABEL_CACHE_SIZE = 4096

# Endings some templates leave open whatever the thinking switch says, and what closes them.
OPEN_ENDINGS = (
    (
        "<|start|>assistant",
        "<|channel|>final<|message|>",
    ),  # GPT-OSS (harmony): pick the final channel
    ("<think>", "</think>"),  # GLM-5.x: an opened reasoning block
    ("<think>\n", "</think>\n"),
)

# Empty reasoning blocks the self-check may prefill, for models that open one by themselves.
EMPTY_REASONING_BLOCKS = (("<think>", "\n\n</think>\n\n"), ("[THINK]", "[/THINK]"))


@dataclass(frozen=True)
class AnswerSlot:
    prompt_ids: list[int]
    label_ids: list[int]


class AnswerSlotPlacer:
    """Places the answer cue and finds the label tokens; label tokens are cached per prompt ending."""

    def __init__(
        self, host: BackendHost, cue: str = ANSWER_CUE, reasoning_block: str = ""
    ) -> None:
        self.host = host
        self.cue = cue
        self.reasoning_block = reasoning_block
        self._labels: dict[tuple[str, str, str], int] = {}

    def ending(self, rendered_ids: Sequence[int]) -> tuple[int, str]:
        """Where the last plain-text run starts, and the text that replaces everything from there."""
        start = self.text_start(rendered_ids)
        closing = self._closing_at(rendered_ids, start)
        return start, self.host.decode(
            rendered_ids[start:]
        ) + closing + self.reasoning_block + self.cue

    def text_start(self, rendered_ids: Sequence[int]) -> int:
        """Where the last plain-text run (after the last special token) starts."""
        special = self.host.special_token_ids()
        start = len(rendered_ids)
        while start > 0 and rendered_ids[start - 1] not in special:
            start -= 1
        return start

    def closing(self, rendered_ids: Sequence[int]) -> str:
        """What closes the ending the template leaves open ("" when it leaves none open)."""
        return self._closing_at(rendered_ids, self.text_start(rendered_ids))

    def _closing_at(self, rendered_ids: Sequence[int], start: int) -> str:
        tail_with_markers = self.host.decode(rendered_ids[max(0, start - 4) :])
        return next(
            (
                closer
                for opener, closer in OPEN_ENDINGS
                if tail_with_markers.endswith(opener)
            ),
            "",
        )

    def place(
        self, rendered_ids: Sequence[int], labels: Sequence[str], spaced: bool = False
    ) -> AnswerSlot:
        """The prompt up to the answer slot and each label's token there. ``spaced``: the prompt ends
        with the space after the cue, and each label is read without one."""
        start, tail_text = self.ending(rendered_ids)
        tail_text += " " if spaced else ""
        tail_ids = self.host.encode(tail_text)
        label_ids = [
            self.label_id(tail_text, tail_ids, label, "" if spaced else " ")
            for label in labels
        ]
        return AnswerSlot(list(rendered_ids[:start]) + tail_ids, label_ids)

    def place_words(
        self, rendered_ids: Sequence[int], words: Sequence[str]
    ) -> AnswerSlot | None:
        """The slot for word labels: after the cue where each word (with its space) is one token there,
        else after the cue's space where each word is one token after it; None where neither holds for
        every word, or where two words share a token."""
        for spaced in (False, True):
            try:
                slot = self.place(rendered_ids, words, spaced)
            except DecisionError:
                continue
            if len(set(slot.label_ids)) == len(words):
                return slot
        return None

    def label_id(
        self, tail_text: str, tail_ids: list[int], label: str, joiner: str = " "
    ) -> int:
        key = (tail_text, joiner, label)
        if key not in self._labels:
            if not label.strip():
                raise DecisionError(f"option label {shown(label)} is blank")
            ids = self.host.encode(f"{tail_text}{joiner}{label}")
            if len(ids) != len(tail_ids) + 1 or ids[: len(tail_ids)] != tail_ids:
                raise DecisionError(
                    f"option label {shown(label)} is not a single token after the answer cue"
                )
            # SentencePiece tokenizers may decode a lone token with its word marker (U+2581) for the space.
            if self.host.decode(ids[-1:]).replace("\u2581", " ").strip() != label:
                raise DecisionError(
                    f"option label {shown(label)} does not decode back to itself"
                )
            # word labels come from requests: keep the newest
            if len(self._labels) >= LABEL_CACHE_SIZE:
                del self._labels[next(iter(self._labels))]
            self._labels[key] = ids[-1]
        return self._labels[key]

    def single_token_labels(
        self, rendered_ids: Sequence[int], candidates: Sequence[str]
    ) -> list[str]:
        """The candidates that are single tokens at this prompt's answer slot, in order."""
        _, tail_text = self.ending(rendered_ids)
        tail_ids = self.host.encode(tail_text)
        usable = []
        for label in candidates:
            try:
                self.label_id(tail_text, tail_ids, label)
            except DecisionError:
                continue
            usable.append(label)
        return usable


def supported_reasoning_blocks(host: BackendHost) -> list[str]:
    """The empty reasoning blocks whose markers are single special tokens of this tokenizer."""
    blocks = []
    special = host.special_token_ids()
    for opener, closer in EMPTY_REASONING_BLOCKS:
        marker_ids = [host.encode(opener), host.encode(closer.strip())]
        if all(len(ids) == 1 and ids[0] in special for ids in marker_ids):
            blocks.append(opener + closer)
    return blocks
