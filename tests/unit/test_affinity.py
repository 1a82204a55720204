"""Which engine replica a decision's reads go to: one per state, whichever read asks."""

from __future__ import annotations

import hashlib

from vllm.entrypoints.generate.decisions.decide.engine.vllm_host import replica_for
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
    as_context,
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_every_read_about_a_state_goes_to_one_replica():
    context = ReadContext.about("the state", "r")
    parts = [context.part(f"r{i}") for i in range(8)]
    chosen = {replica_for(4, part.state_sha256) for part in parts}
    assert chosen == {int(sha("the state")[:12], 16) % 4}
    assert {part.request_id for part in parts} == {f"r-r{i}" for i in range(8)}
    assert replica_for(4, None) is None  # no state named: vLLM balances


def test_one_replica_or_no_state_pins_nothing_and_states_spread():
    assert replica_for(1, sha("x")) is None
    # a plugin's old-style call
    assert replica_for(4, as_context("a bare request id").state_sha256) is None
    assert {replica_for(2, sha(f"state {i}")) for i in range(64)} == {0, 1}
