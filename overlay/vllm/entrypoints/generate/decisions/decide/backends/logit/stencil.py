# SPDX-License-Identifier: Apache-2.0
"""The state's part of the prompt, rendered and tokenized once for every question about it.

A :class:`Stencil` renders the chat once with a placeholder for the question and cuts the head's tokens
at a *seam*: a boundary well before the state's end where tokenizing afresh reproduces them. A
question's prompt is the tokens up to the seam plus those of the rest. Tokenizers without offsets,
templates that rewrite the text and heads with no clean seam render each question in full."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from vllm.entrypoints.generate.decisions.decide.errors import OverLimitError
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    DOCUMENT_FRAME,
    YES_NO_FRAME,
    Frame,
    Shown,
    chat,
)

# Stands in for the question text while the template is rendered; a state containing it is rendered
# question by question instead.
PLACEHOLDER = "\x00decision-question\x00"

# How far (in characters) before the state's last non-blank character the seam must lie, so that the
# text after the state (different for each question) can't change how the text before it tokenizes.
SEAM_MARGIN = 32
# How far back from there a seam is looked for; a state with no clean cut that near (one unbroken run of
# characters, say) is rendered question by question.
SEAM_REACH = 512


@dataclass(frozen=True)
class Stencil:
    prefix_ids: list[int]  # the head's tokens before the seam
    seam_text: str  # the head's text from the seam on
    closing: str  # the template's text after the question

    def prompt_ids(self, host: BackendHost, question_body: str) -> list[int]:
        return self.prefix_ids + host.encode(
            self.seam_text + question_body + self.closing
        )

    async def prompt_ids_async(
        self, host: BackendHost, question_body: str
    ) -> list[int]:
        """:meth:`prompt_ids`, refused by length where it can't fit, tokenized off the event loop."""
        tail = self.seam_text + question_body + self.closing
        check_fits(host, len(self.prefix_ids), len(tail))
        return self.prefix_ids + await host.encode_async(tail)


def check_fits(host: BackendHost, tokens: int, chars: int) -> None:
    """Refuses, before tokenizing ``chars`` more characters, a prompt that can't fit the context
    whatever they tokenize to (engine/token_bound.py)."""
    per, limit = host.chars_per_token, host.max_model_len
    if per is None:
        return
    least = tokens + -(-chars // per)
    if least >= limit:
        raise OverLimitError(
            f"the rendered prompt has at least {least} tokens ({chars} characters, at most {per} a token for "
            f"this tokenizer); the model's context (--max-model-len {limit}) leaves room for at most {limit - 1}"
        )


async def build_stencil(
    host: BackendHost,
    state: str,
    system_role: bool = True,
    frame: Frame = DOCUMENT_FRAME,
) -> Stencil | None:
    if PLACEHOLDER in state:
        return None
    rendered = await host.render_chat_text(
        chat(state, PLACEHOLDER, system_role, frame=frame)
    )
    if rendered is None or rendered.count(PLACEHOLDER) != 1:
        return None
    head, closing = rendered.split(PLACEHOLDER)
    check_fits(host, 0, len(head))
    encoded = await host.encode_with_offsets_async(head)
    if encoded is None:
        return None
    ids, spans = encoded
    for seam in seam_candidates(head, spans):
        seam_text = head[spans[seam][0] :]
        # a clean cut: tokenizing afresh from here changes nothing
        if host.encode(seam_text) == ids[seam:]:
            return Stencil(ids[:seam], seam_text, closing)
    return None


def seam_candidates(head: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    """Token indices to try as the seam, nearest first: the last few before the margin, then line
    starts (a boundary for every tokenizer we know)."""
    limit = len(head.rstrip()) - SEAM_MARGIN
    near = [
        i
        for i in range(len(spans) - 1, 0, -1)
        if limit - SEAM_REACH <= spans[i][0] <= limit
    ]
    line_starts = [i for i in near if head[spans[i][0] - 1] == "\n"]
    return near[:4] + line_starts[:2]


@dataclass
class _Shared:
    build: asyncio.Future[Stencil | None]
    users: int = 0


@dataclass
class StencilPool:
    """Shares one stencil among the reads in flight about the same state and frame; dropped when the
    last of them has its prompt."""

    host: BackendHost
    enabled: bool = True
    # Whether the chat template takes the instructions as a system message (chat_template.py).
    system_role: bool = True
    _shared: dict[tuple[str, Frame], _Shared] = field(default_factory=dict)

    @asynccontextmanager
    async def stencil(
        self, state: str, frame: Frame = DOCUMENT_FRAME
    ) -> AsyncIterator[Stencil | None]:
        if not self.enabled:
            yield None
            return
        key = (state, frame)
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = _Shared(
                asyncio.ensure_future(
                    build_stencil(self.host, state, self.system_role, frame)
                )
            )
            shared.build.add_done_callback(_observe)
        shared.users += 1
        try:
            yield await asyncio.shield(shared.build)
        finally:
            shared.users -= 1
            if shared.users == 0 and self._shared.get(key) is shared:
                del self._shared[key]

    async def prompt_ids(
        self,
        state: str,
        question_body: str,
        examples: Sequence[Shown] = (),
        frame: Frame = DOCUMENT_FRAME,
    ) -> list[int]:
        """One question's prompt, through the shared stencil where there is one; a question with
        examples is rendered whole (its prefix is its examples, not the state)."""
        if examples:
            shown = sum(len(e.state) + len(e.question_body) for e in examples)
            check_fits(self.host, 0, len(state) + shown)
        else:
            async with self.stencil(state, frame) as stencil:
                if stencil is not None:
                    return await stencil.prompt_ids_async(self.host, question_body)
        return await self.host.render_chat(
            chat(state, question_body, self.system_role, examples, frame)
        )


def _observe(build: asyncio.Future[Stencil | None]) -> None:
    """Marks a failed build's exception as seen when every reader has gone."""
    if not build.cancelled():
        build.exception()


# States whose endings stress the seam: blanks, punctuation runs, digits, long words, other scripts.
CHECK_STATES = (
    "Paris is the capital of France.",
    "Order 66125 shipped on 2026-11-30 at 09:45; refund 12.50 EUR.   \n\n\t",
    "Ticket: the login page shows ERROR_CODE_5001 again!!!...",
    "Straße, Ærøskøbing, naïve café; 東京は日本の首都です。 🚀🚀",
    "a" * 80,
)
CHECK_QUESTIONS = (
    "Question: Is this about travel?\n\nOptions:\nA. Yes\nB. No",
    'Question: :) or "quoted"?',
)


async def stencil_check(host: BackendHost, system_role: bool = True) -> bool:
    """Shared rendering is switched on only if, on every probe that has a stencil, it gives exactly
    the tokens of rendering the whole prompt."""
    shared = 0
    for state in CHECK_STATES:
        for frame in (DOCUMENT_FRAME, YES_NO_FRAME):
            stencil = await build_stencil(host, state, system_role, frame)
            if stencil is None:
                continue
            for body in CHECK_QUESTIONS:
                if stencil.prompt_ids(host, body) != await host.render_chat(
                    chat(state, body, system_role, frame=frame)
                ):
                    return False
            shared += 1
    return shared > 0
