"""A BackendHost over a tokenizer alone, for tools that render prompts without a model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.decisions.decide.host import BackendHost, TokenRead


class TokenizerOnlyHost(BackendHost):
    """Renders and tokenizes with a tokenizer as vLLM loads it; it cannot read a model."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.served_model, self.max_model_len, self.architectures = "none", 1 << 20, ()
        self.max_logprobs, self.max_logprob_token_ids, self.logprobs_mode = (
            20,
            128,
            "raw_logprobs",
        )

    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, enable_thinking=False
            )
        except TypeError:
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True
            )
        return list(rendered if isinstance(rendered, list) else rendered["input_ids"])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    def special_token_ids(self) -> frozenset[int]:
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        return frozenset(self.tokenizer.all_special_ids) | frozenset(added)

    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        request_id: str,
        fp32: bool = False,
    ) -> TokenRead:
        raise NotImplementedError("no model here")

    async def read_top_logprobs(
        self, prompt_ids: list[int], k: int, request_id: str, fp32: bool = False
    ) -> TokenRead:
        raise NotImplementedError("no model here")
