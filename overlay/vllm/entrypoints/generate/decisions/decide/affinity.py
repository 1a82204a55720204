# SPDX-License-Identifier: Apache-2.0
"""Which engine replica a decision's reads go to under data parallelism (``--data-parallel-size``).

vLLM balances every engine request on its own, so the questions of one decision would spread over
the replicas and each replica would prefill the shared state again. Each read's context carries the
hash of the state it is about (read_context.py); the host sends every read about one state to the
replica that state hashes to, so the state is prefilled once, and later requests about the same state
find it cached there too.
Different states still spread over the replicas (the hash is uniform); one very hot state stays on one.
"""

from __future__ import annotations


def replica_for(replicas: int, state_sha256: str | None) -> int | None:
    """The replica for reads about the state with this hash, or None (let vLLM balance) with one replica
    or no state named."""
    if replicas <= 1 or not state_sha256:
        return None
    return int(state_sha256[:12], 16) % replicas
