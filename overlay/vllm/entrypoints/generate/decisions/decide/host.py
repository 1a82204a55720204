# SPDX-License-Identifier: Apache-2.0
"""The one door from a backend to the engine.

Backends render prompts, tokenize and read log-probabilities only through a :class:`BackendHost`.
vllm_host.VllmHost implements it over vLLM's engine client; unit tests implement it with fakes.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
)
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
)

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class TokenRead:
    """Next-token log-probabilities at the position after a prompt, with token accounting.

    For an exact read, ``logprobs`` holds the requested ids the engine returned (an incomplete read,
    as under speculative decoding, lacks some); for a top-k read, the k most likely tokens.
    """

    logprobs: dict[int, float]
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Generation:
    """Greedy continuation of a prompt."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int


class BackendHost(ABC):
    """What a backend may ask of the serving engine.

    Every engine call takes the question's :class:`ReadContext` (``context.part(...)`` for each of several
    calls): its request id names the call in vLLM's request log, its state picks the engine replica
    under data parallelism, and its adapter is the LoRA adapter the engine reads through. A bare request
    id still works, for plugins written before contexts.
    """

    served_model: str
    max_model_len: int
    architectures: tuple[str, ...]
    # --max-logprobs: the widest top-k read (-1: the whole vocabulary).
    max_logprobs: int
    # MAX_LOGPROB_TOKEN_IDS: the most token ids one exact read may name.
    max_logprob_token_ids: int
    # --logprobs-mode: only "raw_logprobs" returns true log-probabilities.
    logprobs_mode: str
    # --trust-remote-code: whether code shipped with the checkpoint may run.
    trust_remote_code: bool = False
    # The served tokenizer, for backends whose checkpoint builds its own prompts (None: not available).
    tokenizer: Any = None
    # The model's vocabulary size (0: unknown), e.g. for drawing noise tokens.
    vocab_size: int = 0
    # Whether the engine can do read-only canvas reads (:meth:`read_canvas`): a diffusion model on vLLM
    # 0.32, or on 0.30 with patches/00572.
    canvas_reads: bool = False
    # The dtype the LM head computes logits in ("bfloat16", "float16", "float32").
    logit_dtype: str = "float32"
    # Why reads can't ask for fp32 log-probabilities under a half-precision LM head (None: they can,
    # a vLLM with patches/exact-logprobs; see :meth:`read_token_logprobs`).
    fp32_reads_missing: str | None = "this host can't recompute logits"
    # Whether the engine schedules by a request's priority (vllm serve --scheduling-policy priority); where
    # it doesn't, the service refuses a priority other than 0. Reads pass ``context.priority`` and
    # ``context.cache_salt`` to the engine as vLLM's own APIs do.
    priority_scheduling: bool = False
    # The most characters of prompt text one token can stand for (None: no sure bound), so a prompt too
    # long for the context is refused by its length before it is tokenized (token_bound.py).
    chars_per_token: int | None = None

    @abstractmethod
    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The served chat template applied to ``messages``, ready for the assistant's first token
        (generation prompt on, thinking off), as token ids."""

    async def render_chat_text(self, messages: list[dict[str, str]]) -> str | None:
        """The same rendering as :meth:`render_chat`, as text (None: this host can't give text)."""
        return None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens."""

    def encode_with_offsets(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """:meth:`encode` with each token's (start, end) character span (None: not available)."""
        return None

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str: ...

    async def encode_async(self, text: str) -> list[int]:
        """:meth:`encode` in a worker thread: a long text must not hold up the server's other clients."""
        return await asyncio.to_thread(self.encode, text)

    async def encode_with_offsets_async(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """:meth:`encode_with_offsets` in a worker thread."""
        return await asyncio.to_thread(self.encode_with_offsets, text)

    @abstractmethod
    def special_token_ids(self) -> frozenset[int]:
        """Ids the tokenizer never produces from plain text (template markers and the like)."""

    def stopped_by(self, exc: BaseException) -> bool:
        """Whether ``exc`` came of the engine stopping under the work that raised it (the server
        shutting down), not of a fault: startup work cut short then logs what it stopped, not an error."""
        return False

    @abstractmethod
    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        """One forward pass over ``prompt_ids``: the next-token log-probability of each of
        ``token_ids`` over the full vocabulary. No token is kept. ``fp32``: recompute the returned
        values in fp32 where :attr:`fp32_reads_missing` is None (ignored elsewhere)."""

    @abstractmethod
    async def read_top_logprobs(
        self,
        prompt_ids: list[int],
        k: int,
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        """One forward pass over ``prompt_ids``: the ``k`` most likely next tokens and their
        log-probabilities (``k = -1``: the whole vocabulary); ``fp32`` as for :meth:`read_token_logprobs`."""

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, context: ReadContext[Any] | str
    ) -> Generation:
        """Greedy generation of up to ``max_tokens`` tokens (for backends that read generated text)."""
        raise DecisionError("this host cannot generate", HTTPStatus.NOT_IMPLEMENTED)

    async def pool(
        self, prompt_ids: list[int], task: str, context: ReadContext[Any] | str
    ) -> Any:
        """One pooling pass (for pooling models, e.g. ``token_classify``): the pooler's output as lists."""
        raise DecisionError("this host cannot pool", HTTPStatus.NOT_IMPLEMENTED)

    async def read_canvas(
        self,
        prompt_ids: list[int],
        canvas_ids: list[int],
        token_ids: list[int],
        max_steps: int,
        context: ReadContext[Any] | str,
    ) -> TokenRead:
        """A read-only canvas read (diffusion models): the canvas after ``prompt_ids`` starts as
        ``canvas_ids``, only its first position may change, the engine denoises at most ``max_steps``
        times, and the result is the log-probability of each of ``token_ids`` at that first position."""
        raise DecisionError(
            "this engine has no canvas read (patches/00572)", HTTPStatus.NOT_IMPLEMENTED
        )

    def checkpoint_config(self) -> dict[str, Any]:
        """The served checkpoint's ``config.json`` as a dict."""
        return {}

    def checkpoint_file(self, name: str) -> bytes | None:
        """A file shipped with the served checkpoint (None: it has none by that name)."""
        return None
