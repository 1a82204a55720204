from __future__ import annotations

import asyncio

import pytest

from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel


async def test_results_in_order():
    async def value(v, delay):
        await asyncio.sleep(delay)
        return v

    assert await gather_or_cancel([value(1, 0.02), value(2, 0), value(3, 0.01)]) == [
        1,
        2,
        3,
    ]


async def test_one_failure_cancels_the_rest():
    finished, cancelled = [], []

    async def slow(i):
        try:
            await asyncio.sleep(30)
            finished.append(i)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    async def failing():
        await asyncio.sleep(0.01)
        raise ValueError("engine said no")

    with pytest.raises(ValueError, match="engine said no"):
        await asyncio.wait_for(gather_or_cancel([slow(0), failing(), slow(2)]), 5)
    assert sorted(cancelled) == [0, 2] and not finished
