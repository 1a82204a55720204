# SPDX-License-Identifier: Apache-2.0
"""What a read depends on besides its question, passed as an argument from the service to the engine:
nothing about a request travels any other way."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

OptionsT = TypeVar("OptionsT")


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Example:
    """A labelled input shown ahead of the input as an answered turn, and its option's key."""

    state: str
    answer: str


@dataclass(frozen=True)
class ReadContext(Generic[OptionsT]):
    """One question's read. The state's hash picks the replica (vllm_host.replica_for); the salt,
    priority and adapter go to the engine with every read (vLLM's defaults by default)."""

    state: str
    state_sha256: str
    request_id: str
    options: OptionsT
    cache_salt: str | None = None
    priority: int = 0
    adapter: LoRARequest | None = None
    examples: tuple[Example, ...] = ()

    @classmethod
    def about(
        cls, state: str, request_id: str, options: Any = None
    ) -> ReadContext[Any]:
        return cls(state, sha256_of(state), request_id, options)

    def part(self, suffix: str) -> ReadContext[OptionsT]:
        """The same read under a sub-request id (``<id>-<suffix>``)."""
        return replace(self, request_id=f"{self.request_id}-{suffix}")

    def with_options(self, options: Any) -> ReadContext[Any]:
        return replace(self, options=options)

    def with_examples(self, examples: tuple[Example, ...]) -> ReadContext[OptionsT]:
        return replace(self, examples=examples)

    def with_state(self, state: str, request_id: str) -> ReadContext[OptionsT]:
        """A read about another text (the content-free prior's neutral inputs)."""
        return replace(
            self, state=state, state_sha256=sha256_of(state), request_id=request_id
        )


def as_context(context: ReadContext[Any] | str) -> ReadContext[Any]:
    """A bare request id (plugins written before contexts) names no state: vLLM balances it itself."""
    if isinstance(context, ReadContext):
        return context
    return ReadContext("", "", context, None)
