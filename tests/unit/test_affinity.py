"""Which engine replica a decision's reads go to: one per state, the same in every task started for it."""

from __future__ import annotations

import asyncio
import hashlib

from vllm.entrypoints.generate.decisions.affinity import reads_about, replica_for


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_every_read_about_a_state_goes_to_one_replica():
    async def read() -> int | None:
        await asyncio.sleep(0)
        return replica_for(4)

    with reads_about(sha("the state")):
        chosen = await asyncio.gather(*(asyncio.create_task(read()) for _ in range(8)))
    assert len(set(chosen)) == 1 and chosen[0] == int(sha("the state")[:12], 16) % 4
    assert replica_for(4) is None  # outside: vLLM balances


def test_one_replica_or_no_state_pins_nothing_and_states_spread():
    with reads_about(sha("x")):
        assert replica_for(1) is None
    replicas = set()
    for i in range(64):
        with reads_about(sha(f"state {i}")):
            replicas.add(replica_for(2))
    assert replicas == {0, 1}
