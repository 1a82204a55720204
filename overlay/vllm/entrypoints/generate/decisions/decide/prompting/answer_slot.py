# SPDX-License-Identifier: Apache-2.0
"""Where the model's next token is its answer, and which token each option label is there.

What the template leaves open at the assistant's turn is closed, then come an optional empty reasoning
block and the answer cue; the last plain-text run is re-tokenized with them, as the tokenizer would. A
label must be one token there that leaves the prompt's tokens unchanged and decodes back to itself, or
the question is refused: reading another token would report the wrong probability. Word labels may be
read after a space ending the prompt instead: most BPE tokenizers keep a digit apart from its space."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError, shown
from vllm.entrypoints.generate.decisions.decide.host import BackendHost

ANSWER_CUE = "Answer:"

# Letters and pairs need about 700 per prompt ending; words come from requests: the oldest go.
LABEL_CACHE_SIZE = 4096

# Endings some templates leave open whatever the thinking switch says, and what closes them:
# GPT-OSS (harmony) picks the final channel, GLM-5.x closes its opened reasoning block.
OPEN_ENDINGS = (
    ("<|start|>assistant", "<|channel|>final<|message|>"),
    ("<think>", "</think>"),
    ("<think>\n", "</think>\n"),
)

# Empty reasoning blocks the self-check may prefill, for models that open one by themselves.
EMPTY_REASONING_BLOCKS = (("<think>", "\n\n</think>\n\n"), ("[THINK]", "[/THINK]"))


@dataclass(frozen=True)
class AnswerSlot:
    prompt_ids: list[int]
    label_ids: list[int]


class AnswerSlotPlacer:
    """Places the answer cue and finds the label tokens, cached per prompt ending."""

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
        closing = self.closing(rendered_ids, start)
        text = self.host.decode(rendered_ids[start:])
        return start, text + closing + self.reasoning_block + self.cue

    def text_start(self, rendered_ids: Sequence[int]) -> int:
        special = self.host.special_token_ids()
        start = len(rendered_ids)
        while start > 0 and rendered_ids[start - 1] not in special:
            start -= 1
        return start

    def closing(self, rendered_ids: Sequence[int], start: int | None = None) -> str:
        """What closes the ending the template leaves open ("" when it leaves none open)."""
        if start is None:
            start = self.text_start(rendered_ids)
        tail_with_markers = self.host.decode(rendered_ids[max(0, start - 4) :])
        for opener, closer in OPEN_ENDINGS:
            if tail_with_markers.endswith(opener):
                return closer
        return ""

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
        """The slot for word labels, after the cue or else after its space; None where neither makes each
        word its own single token."""
        for spaced in (False, True):
            with suppress(DecisionError):
                slot = self.place(rendered_ids, words, spaced)
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
            with suppress(DecisionError):
                self.label_id(tail_text, tail_ids, label)
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
