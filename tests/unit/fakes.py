"""Fakes for pure-logic tests: a host over a real tokenizer with scripted log-probabilities, and a
backend with scripted scores. Neither runs a model."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

from vllm.entrypoints.generate.decisions.decide.backends import DecisionBackend, Reading
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.host import BackendHost, TokenRead
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion


class TokenizerHost(BackendHost):
    """A host that renders and tokenizes with a real Hugging Face tokenizer; reads are scripted by
    ``logprob(prompt_ids, token)``. ``drop`` makes exact reads lose ids, as under speculative decoding."""

    def __init__(
        self,
        tokenizer,
        max_model_len: int = 4096,
        logprob: Callable[[list[int], int], float] | None = None,
        max_logprobs: int = 20,
        drop: Callable[[int], bool] | None = None,
        chat_template: str | None = None,
        offsets: bool = True,
    ):
        self.tokenizer = tokenizer
        self.offsets = offsets
        self.renders = 0
        self.chat_template = chat_template
        self.served_model = "fake-model"
        self.max_model_len = max_model_len
        self.architectures = ("FakeForCausalLM",)
        self.max_logprobs = max_logprobs
        self.max_logprob_token_ids = 128
        self.logprobs_mode = "raw_logprobs"
        self.logprob = logprob or (lambda prompt, token: -1.0 - (token % 7) / 10)
        self.drop = drop or (lambda token: False)
        self.reads: list[tuple[list[int], list[int]]] = []
        self.top_reads: list[tuple[list[int], int]] = []

    async def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode(await self.render_chat_text(messages))

    async def render_chat_text(self, messages: list[dict[str, str]]) -> str:
        self.renders += 1
        return self.tokenizer.apply_chat_template(
            messages,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=True,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_with_offsets(
        self, text: str
    ) -> tuple[list[int], list[tuple[int, int]]] | None:
        if not self.offsets:
            return None
        encoded = self.tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True
        )
        return list(encoded["input_ids"]), [
            tuple(span) for span in encoded["offset_mapping"]
        ]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    def special_token_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.all_special_ids) | frozenset(
            self.tokenizer.added_tokens_decoder
        )

    async def read_token_logprobs(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        request_id: str,
        fp32: bool = False,
    ) -> TokenRead:
        self.reads.append((prompt_ids, token_ids))
        return TokenRead(
            {t: self.logprob(prompt_ids, t) for t in token_ids if not self.drop(t)},
            len(prompt_ids),
            0,
        )

    async def read_top_logprobs(
        self, prompt_ids: list[int], k: int, request_id: str, fp32: bool = False
    ) -> TokenRead:
        self.top_reads.append((prompt_ids, k))
        scores = {t: self.logprob(prompt_ids, t) for t in range(len(self.tokenizer))}
        top = sorted(scores, key=scores.__getitem__, reverse=True)[:k]
        return TokenRead({t: scores[t] for t in top}, len(prompt_ids), 0)


class ScriptedBackend(DecisionBackend):
    """Scores each question by a function of the question; counts concurrent reads."""

    name = "scripted"
    render_version = "scripted-1"

    def __init__(
        self, score: Callable[[CompiledQuestion], list[float]], delay: float = 0.0
    ) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]
        self.score = score
        self.delay = delay
        self.in_flight = 0
        self.most_in_flight = 0

    async def read(self, question, context) -> Reading:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            scores = self.score(question)
        finally:
            self.in_flight -= 1
        if scores is None:
            raise DecisionError(f"scripted refusal of {question.instructions!r}")
        return Reading(
            scores=scores,
            forward_passes=1,
            input_tokens=10,
            cached_input_tokens=4,
            readout="direct",
            option_mass=sum(math.exp(s) for s in scores),
        )


def one_read(scores: list[float]) -> Reading:
    """A backend's reading of ``scores`` in one forward pass of 10 uncached prompt tokens."""
    return Reading(
        scores=scores,
        forward_passes=1,
        input_tokens=10,
        cached_input_tokens=0,
        readout="direct",
    )
