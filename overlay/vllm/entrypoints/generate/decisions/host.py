# SPDX-License-Identifier: Apache-2.0
"""The one door from a backend to the engine.

Backends render prompts, tokenize and read log-probabilities only through a :class:`BackendHost`.
:class:`VllmHost` implements it over vLLM's engine client; unit tests implement it with fakes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from .errors import DecisionError

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient


@dataclass(frozen=True)
class TokenRead:
    """Log-probabilities of chosen tokens at the position after a prompt, with token accounting."""

    logprobs: dict[int, float]
    prompt_tokens: int
    cached_tokens: int


class BackendHost(ABC):
    """What a backend may ask of the serving engine."""

    served_model: str
    max_model_len: int
    architectures: tuple[str, ...]

    @abstractmethod
    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The served chat template applied to ``messages``, ready for the assistant's first token
        (generation prompt on, thinking off), as token ids."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str: ...

    @abstractmethod
    def special_token_ids(self) -> frozenset[int]:
        """Ids the tokenizer never produces from plain text (template markers and the like)."""

    @abstractmethod
    async def read_token_logprobs(self, prompt_ids: list[int], token_ids: list[int], request_id: str) -> TokenRead:
        """One forward pass over ``prompt_ids``: the next-token log-probability of each of
        ``token_ids`` over the full vocabulary. No token is kept."""


class VllmHost(BackendHost):
    """:class:`BackendHost` over a running vLLM engine client."""

    def __init__(
        self,
        engine_client: EngineClient,
        served_model: str,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.engine_client = engine_client
        self.served_model = served_model
        model_config = engine_client.model_config
        self.max_model_len = model_config.max_model_len
        self.architectures = tuple(getattr(model_config.hf_config, "architectures", None) or ())
        self.renderer = engine_client.renderer
        self.tokenizer = self.renderer.get_tokenizer()
        self._chat_template = chat_template
        # Our own switches win over the server's defaults: the answer slot needs them.
        self._chat_template_kwargs = {
            **(chat_template_kwargs or {}),
            "add_generation_prompt": True,
            "enable_thinking": False,
        }
        self._special_ids = frozenset(self.tokenizer.all_special_ids) | frozenset(
            getattr(self.tokenizer, "added_tokens_decoder", {}) or ()
        )

    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        from vllm.renderers.params import ChatParams

        params = ChatParams(chat_template=self._chat_template, chat_template_kwargs=self._chat_template_kwargs)
        _, prompt = await self.renderer.render_messages_async(messages, params)
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        return self.encode(prompt["prompt"])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    async def read_token_logprobs(self, prompt_ids: list[int], token_ids: list[int], request_id: str) -> TokenRead:
        from vllm.inputs import tokens_input
        from vllm.sampling_params import SamplingParams

        # logprob_token_ids returns full-vocabulary log-probabilities of exactly these ids.
        # prompt_logprobs stays unset: it would switch off prefix-cache reads.
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=token_ids)
        final = None
        async for output in self.engine_client.generate(tokens_input(prompt_ids), params, request_id):
            final = output
        if final is None or not final.outputs or not final.outputs[0].logprobs:
            raise DecisionError("the engine returned no log-probabilities", HTTPStatus.INTERNAL_SERVER_ERROR)
        position = final.outputs[0].logprobs[0]
        missing = [t for t in token_ids if t not in position]
        if missing:
            raise DecisionError(
                f"the engine returned no log-probability for token ids {missing}",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        return TokenRead(
            logprobs={t: float(position[t].logprob) for t in token_ids},
            prompt_tokens=len(prompt_ids),
            cached_tokens=int(final.num_cached_tokens or 0),
        )
