# SPDX-License-Identifier: Apache-2.0
"""The content-free prior: a question read about neutral inputs, cached per question fingerprint.

A small model leans to one label whatever the evidence, and a temperature never changes which option
is on top; subtracting what it says with no evidence does. The ``fitted`` correction's per-position
bias comes from calibration/bias.py instead.
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
    """Content-free log-probabilities in the order read, and whether they came from the cache."""

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
    """Everything a content-free read depends on, options in the order read."""
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


# Estimates from CPython's sizes: an entry's digest, slot, future and list; a float and its pointer.
ENTRY_OVERHEAD = 256
VALUE_BYTES = 32


def entry_bytes(values: int) -> int:
    return ENTRY_OVERHEAD + VALUE_BYTES * values


class PriorCache:
    """Content-free reads by fingerprint, LRU within ``size`` entries and ``max_bytes``. Keyed by the
    fingerprint's SHA-256, so a long question costs no more; a read in flight is shared, a failed one
    not kept."""

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
        while len(self._entries) > 1 and (
            len(self._entries) > self.size
            or (self.max_bytes is not None and self.bytes > self.max_bytes)
        ):
            _, (_, cost) = self._entries.popitem(last=False)
            self.bytes -= cost


def mean_log_probabilities(readings: Sequence[Sequence[float]]) -> list[float]:
    rows = [[max(v, PRIOR_FLOOR) for v in log_softmax(list(r))] for r in readings]
    return [sum(column) / len(rows) for column in zip(*rows, strict=True)]
