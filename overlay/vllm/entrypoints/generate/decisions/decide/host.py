# SPDX-License-Identifier: Apache-2.0
"""The one door from a backend to the engine: vllm_host.VllmHost over vLLM's engine client, fakes in
unit tests."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeAlias

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext

EncodedSpans: TypeAlias = tuple[list[int], list[tuple[int, int]]]


@dataclass(frozen=True)
class TokenRead:
    """Next-token log-probabilities after a prompt. An exact read may lack some requested ids (as under
    speculative decoding); a top-k read holds the k most likely tokens."""

    logprobs: dict[int, float]
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Generation:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int


class BackendHost(ABC):
    """What a backend may ask of the serving engine. Every engine call takes the question's
    :class:`ReadContext` (``context.part(...)`` for each of several calls); a bare request id still
    works, for plugins written before contexts."""

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
    # Read-only canvas reads (:meth:`read_canvas`): a diffusion model on vLLM 0.32, or 0.30 with patches/00572.
    canvas_reads: bool = False
    # The dtype the LM head computes logits in ("bfloat16", "float16", "float32").
    logit_dtype: str = "float32"
    # Why fp32 reads can't be had under a half-precision LM head (None: patches/exact-logprobs is in).
    fp32_reads_missing: str | None = "this host can't recompute logits"
    # --scheduling-policy priority; without it the service refuses a priority other than 0.
    priority_scheduling: bool = False
    # Most characters per token (None: no bound), to refuse a long prompt before tokenizing it.
    chars_per_token: int | None = None

    @abstractmethod
    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The served chat template applied to ``messages`` (generation prompt on, thinking off)."""

    async def render_chat_text(self, messages: list[dict[str, str]]) -> str | None:
        """:meth:`render_chat` as text (None: this host can't give text)."""
        return None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens."""

    def encode_with_offsets(self, text: str) -> EncodedSpans | None:
        """:meth:`encode` with each token's (start, end) character span (None: not available)."""
        return None

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str: ...

    async def encode_async(self, text: str) -> list[int]:
        """:meth:`encode` in a worker thread, so a long text doesn't hold up other clients."""
        return await asyncio.to_thread(self.encode, text)

    async def encode_with_offsets_async(self, text: str) -> EncodedSpans | None:
        return await asyncio.to_thread(self.encode_with_offsets, text)

    @abstractmethod
    def special_token_ids(self) -> frozenset[int]:
        """Ids the tokenizer never produces from plain text (template markers and the like)."""

    def stopped_by(self, exc: BaseException) -> bool:
        """Whether ``exc`` came of the engine shutting down, not of a fault (startup then logs no error)."""
        return False

    @abstractmethod
    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        """One forward pass: the next-token log-probability of each of ``token_ids``. ``fp32``: recompute
        them in fp32 where :attr:`fp32_reads_missing` is None (ignored elsewhere)."""

    @abstractmethod
    async def read_top_logprobs(
        self,
        prompt_ids: list[int],
        k: int,
        context: ReadContext[Any] | str,
        fp32: bool = False,
    ) -> TokenRead:
        """One forward pass: the ``k`` most likely next tokens (``-1``: the whole vocabulary)."""

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, context: ReadContext[Any] | str
    ) -> Generation:
        raise DecisionError("this host cannot generate", HTTPStatus.NOT_IMPLEMENTED)

    async def pool(
        self, prompt_ids: list[int], task: str, context: ReadContext[Any] | str
    ) -> Any:
        """One pooling pass (e.g. ``token_classify``): the pooler's output as lists."""
        raise DecisionError("this host cannot pool", HTTPStatus.NOT_IMPLEMENTED)

    async def read_canvas(
        self,
        prompt_ids: list[int],
        canvas_ids: list[int],
        token_ids: list[int],
        max_steps: int,
        context: ReadContext[Any] | str,
    ) -> TokenRead:
        """A read-only canvas read (diffusion models): from ``canvas_ids``, only the first position may
        change; the log-probability of each of ``token_ids`` there after at most ``max_steps`` steps."""
        raise DecisionError(
            "this engine has no canvas read (patches/00572)", HTTPStatus.NOT_IMPLEMENTED
        )

    def checkpoint_config(self) -> dict[str, Any]:
        return {}

    def checkpoint_file(self, name: str) -> bytes | None:
        """A file shipped with the served checkpoint (None: no such file)."""
        return None
