# SPDX-License-Identifier: Apache-2.0
"""Laya's prompt layout, built without ever cutting: a question or state that does not fit is refused.

    [CLS] <type> question: <instructions> [SEP] [MASK] option ... [MASK] option [SEP] <state> [SEP]

This file is self-contained (the standard library and a tokenizer) because it is also what a checkpoint
ships as its own ``laya_prompts.py``: the server runs a checkpoint's copy only under
``--trust-remote-code`` and falls back to this one otherwise.
"""

from __future__ import annotations

from typing import Any

PROMPT_VERSION = "laya-v1"
# Laya leaves the instructions at least this many tokens when options crowd the head; past that it cuts
# options, so a question needing it is refused here.
INSTRUCTION_RESERVE = 16


def build_prompt(
    tokenizer: Any,
    state: str,
    question_type: str,
    instructions: str,
    options: list[str],
    *,
    max_len: int,
    head_max_len: int,
    option_max_tokens: int,
) -> tuple[list[int], list[int]]:
    """The token ids and each option's marker position; ValueError when something would not fit."""
    mask = tokenizer.mask_token

    def encode(text: str) -> list[int]:
        # A [MASK] typed into the text would read as an option marker.
        return list(tokenizer.encode(text.replace(mask, " "), add_special_tokens=False))

    head = encode(f"{question_type} question: {instructions}")
    spans = []
    for index, option in enumerate(options):
        tokens = encode(" " + option)
        if len(tokens) > option_max_tokens:
            raise ValueError(
                f"option {index} takes {len(tokens)} tokens; this checkpoint reads at most {option_max_tokens} "
                "per option (laya_config.option_max_tokens)"
            )
        spans.append([tokenizer.mask_token_id, *tokens])
    option_tokens = sum(len(span) for span in spans)
    if (
        option_tokens > head_max_len - INSTRUCTION_RESERVE
        or len(head) + option_tokens > head_max_len
    ):
        raise ValueError(
            f"the question takes {len(head) + option_tokens} tokens (instructions {len(head)}, options "
            f"{option_tokens}); this checkpoint's question head holds {head_max_len} "
            f"(laya_config.head_max_len), at most {head_max_len - INSTRUCTION_RESERVE} of them options"
        )
    ids = [tokenizer.cls_token_id, *head, tokenizer.sep_token_id]
    markers = []
    for span in spans:
        markers.append(len(ids))
        ids.extend(span)
    ids.append(tokenizer.sep_token_id)
    state_ids = encode(state)
    room = max_len - len(ids) - 1
    if len(state_ids) > room:
        raise ValueError(
            f"the input takes {len(state_ids)} tokens; with this question the checkpoint reads at most {room} "
            f"(laya_config.max_len = {max_len})"
        )
    return [*ids, *state_ids, tokenizer.sep_token_id], markers
