# SPDX-License-Identifier: Apache-2.0
"""Corrections for what a model answers whatever the input says: its prior over the options.

A small model reading lettered options leans to one letter or one word whatever the evidence, and
the evidence moves its log-probabilities by a few hundredths; a temperature never changes which option
is on top, so calibration alone can't fix that. Two corrections, each a shift of a reading's
log-probabilities (each reading first normalised over the options):

- ``content-free``: the same question read about neutral inputs (``NEUTRAL_INPUTS``), its mean
  log-probabilities subtracted: what the model says with no evidence is taken out. The neutral reads
  depend only on the question, so they are cached per question fingerprint (:class:`PriorCache`): a
  server asking the same questions about many inputs pays them once per distinct question, submitted
  with the first real read.
- ``fitted``: an additive bias per option position (a letter, a level), per question type, fitted with
  the temperature on the calibration set (calibration/bias.py).

``auto`` is what startup calibration chose for each type by held-out log loss and accuracy (``off``
where nothing helped or nothing was measured). ``option_logits`` stay the raw reading; the audit gives
the correction and the adjusted scores the temperature divides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from vllm.entrypoints.generate.decisions.decide.scoring import log_softmax

# Inputs that carry no evidence; each is one read per distinct question, averaged.
NEUTRAL_INPUTS = ("N/A", "")
# The lowest content-free log-probability subtracted: an option the model never gives without evidence
# must not become certain with it.
PRIOR_FLOOR = -20.0


@dataclass(frozen=True)
class PriorRead:
    """A question's content-free log-probabilities in the order it was read, and whether they came
    from the cache."""

    logprobs: list[float]
    cached: bool


def fingerprint(
    backend: str,
    render_version: str,
    options: Any,
    qtype: str,
    instructions: str,
    option_texts: Sequence[str],
    examples: Sequence[tuple[str, str]] = (),
) -> str:
    """What a content-free read depends on: the backend and its options, the prompt's version, the
    question as read (its type, criterion and option texts in the order read) and the in-context
    examples ahead of it (input, answer key)."""
    dumped = (
        options.model_dump(mode="json") if isinstance(options, BaseModel) else options
    )
    return json.dumps(
        [
            backend,
            render_version,
            dumped,
            qtype,
            instructions,
            list(option_texts),
            [list(example) for example in examples],
        ],
        sort_keys=True,
    )


# What one cached entry costs besides its values: the digest, the table slot, the future and the list.
ENTRY_OVERHEAD = 256
# What one cached value costs: a float object and the list's pointer to it.
VALUE_BYTES = 32


def entry_bytes(values: int) -> int:
    """The memory a cached entry of ``values`` log-probabilities holds (an estimate from CPython's sizes)."""
    return ENTRY_OVERHEAD + VALUE_BYTES * values


class PriorCache:
    """Content-free reads by question fingerprint, the most recently used kept: at most ``size`` of them
    and at most ``max_bytes`` of memory. A fingerprint holds the question's whole text, so it is kept as
    its SHA-256 digest: a long question costs the cache as much as a short one. A read in flight is
    shared by every request that needs it; a failed read is not kept."""

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        # digest -> [the read, what it costs]
        self._entries: OrderedDict[bytes, list[Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(
        self, key: str, read: Callable[[], Awaitable[list[float]]]
    ) -> PriorRead:
        digest = hashlib.sha256(key.encode()).digest()
        entry = self._entries.get(digest)
        if entry is not None:
            self._entries.move_to_end(digest)
            return PriorRead(list(await asyncio.shield(entry[0])), True)
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        entry = [future, entry_bytes(0)]
        self._entries[digest] = entry
        self.bytes += entry[1]
        self._evict()
        try:
            value = await read()
        except BaseException as exc:
            if self._entries.get(digest) is entry:
                del self._entries[digest]
                self.bytes -= entry[1]
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it; nobody else needs to
            raise
        future.set_result(value)
        if self._entries.get(digest) is entry:
            grown = entry_bytes(len(value))
            self.bytes += grown - entry[1]
            entry[1] = grown
            self._evict()
        return PriorRead(list(value), False)

    def _evict(self) -> None:
        """The least recently used out until both bounds hold (the newest entry stays)."""
        while len(self._entries) > 1 and (
            len(self._entries) > self.size
            or (self.max_bytes is not None and self.bytes > self.max_bytes)
        ):
            _, (_, cost) = self._entries.popitem(last=False)
            self.bytes -= cost


def mean_log_probabilities(readings: Sequence[Sequence[float]]) -> list[float]:
    """The neutral readings' log-probabilities over the options, averaged."""
    rows = [[max(v, PRIOR_FLOOR) for v in log_softmax(list(r))] for r in readings]
    return [sum(column) / len(rows) for column in zip(*rows, strict=True)]
