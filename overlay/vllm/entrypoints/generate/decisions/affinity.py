# SPDX-License-Identifier: Apache-2.0
"""Which engine replica a decision's reads go to under data parallelism (``--data-parallel-size``).

vLLM balances every engine request on its own, so the questions of one decision would spread over
the replicas and each replica would prefill the shared state again. The service names the state its
reads are about; the host then sends every read about one state to the replica that state hashes to,
so the state is prefilled once, and later requests about the same state find it cached there too.
Different states still spread over the replicas (the hash is uniform); one very hot state stays on one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_STATE: ContextVar[str | None] = ContextVar("decision_state_sha256", default=None)


@contextmanager
def reads_about(state_sha256: str) -> Iterator[None]:
    """Reads started inside (tasks included) are about this state."""
    token = _STATE.set(state_sha256)
    try:
        yield
    finally:
        _STATE.reset(token)


def replica_for(replicas: int) -> int | None:
    """The replica for the current state's reads, or None (let vLLM balance) with one replica or none named."""
    state = _STATE.get()
    if replicas <= 1 or state is None:
        return None
    return int(state[:12], 16) % replicas
