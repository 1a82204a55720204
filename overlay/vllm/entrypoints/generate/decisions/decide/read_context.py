# SPDX-License-Identifier: Apache-2.0
"""What a read depends on besides its question, passed as an argument from the service to the engine.

The service builds one :class:`ReadContext` per question; debiasing, the backend and the host pass it
on (each sub-read names itself with :meth:`ReadContext.part`). The host reads the request id for vLLM's
request log, the state's hash for replica affinity (vllm_host.replica_for), and the client's ``cache_salt`` and
``priority`` and the LoRA adapter the request named (adapters.py), which it hands to the engine with every
read; the backend reads the state and its options.
Nothing about a request travels any other way.
"""

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
    """A labelled input of a question, shown ahead of the input as an answered turn (in-context
    examples): the input, and the key of the option that answers it."""

    state: str
    answer: str


@dataclass(frozen=True)
class ReadContext(Generic[OptionsT]):
    """One question's read: the state it is about (and that state's SHA-256), the engine request id
    (each engine read under it adds a suffix) and the backend's options for this request; the engine's
    prefix-cache salt, scheduling priority and LoRA adapter for every read of it (vLLM's own: none, 0 and
    none, the base model, by default); and the answered examples calibration kept for the question
    (none by default), which backends that show examples put ahead of the state."""

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
        """The same read under a sub-request id (``<id>-<suffix>``), for one of several engine reads."""
        return replace(self, request_id=f"{self.request_id}-{suffix}")

    def with_options(self, options: Any) -> ReadContext[Any]:
        return replace(self, options=options)

    def with_examples(self, examples: tuple[Example, ...]) -> ReadContext[OptionsT]:
        return replace(self, examples=examples)

    def with_state(self, state: str, request_id: str) -> ReadContext[OptionsT]:
        """A read about another text (the content-free prior's neutral inputs), with these options."""
        return replace(
            self, state=state, state_sha256=sha256_of(state), request_id=request_id
        )


def as_context(context: ReadContext[Any] | str) -> ReadContext[Any]:
    """A host method's read context; a bare request id (plugins written before contexts) reads with no
    state named, so vLLM balances it on its own under data parallelism."""
    return (
        context
        if isinstance(context, ReadContext)
        else ReadContext("", "", context, None)
    )
