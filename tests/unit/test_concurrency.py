from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import os
import sys
import threading
import weakref

import pytest

from vllm.entrypoints.generate.decisions.decide import concurrency
from vllm.entrypoints.generate.decisions.decide.concurrency import (
    gather_or_cancel,
    off_the_loop,
    parsed_off_the_loop,
)


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


async def test_preparation_runs_on_one_thread_beside_the_loop_and_keeps_the_context():
    request = contextvars.ContextVar("request", default="none")
    request.set("r-1")

    def prepare(n: int) -> tuple[str, str, int]:
        return threading.current_thread().name, request.get(), n * 2

    results = await asyncio.gather(*(off_the_loop(prepare, n) for n in range(8)))
    assert {name for name, _, _ in results} == {results[0][0]}
    assert results[0][0] != threading.current_thread().name
    assert [value for _, _, value in results] == [n * 2 for n in range(8)]
    assert {seen for _, seen, _ in results} == {"r-1"}


async def test_a_failure_in_preparation_reaches_the_caller():
    def refuse() -> None:
        raise ValueError("too deep")

    with pytest.raises(ValueError, match="too deep"):
        await off_the_loop(refuse)


async def test_a_parse_cancelled_before_its_turn_never_runs_and_holds_nothing():
    """Large bodies wait their turn on the event loop: a client that leaves while its body waits lets
    go of the body at once (nothing of it sits in the thread's queue) and it is never parsed."""
    started, release = threading.Event(), threading.Event()
    ran = []

    def busy():
        started.set()
        release.wait(10)
        return "first"

    first = asyncio.ensure_future(parsed_off_the_loop(busy))
    await asyncio.to_thread(started.wait, 10)
    waiting = asyncio.ensure_future(parsed_off_the_loop(ran.append, "second"))
    await asyncio.sleep(0.05)
    assert (
        concurrency._PARSING._work_queue.qsize() == 0
    )  # waiting on the loop, not in the queue
    waiting.cancel()
    release.set()
    assert await first == "first"
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await parsed_off_the_loop(len, "abc") == 3 and ran == []


@pytest.mark.skipif(
    sys.platform != "linux", reason="a thread's own nice value is Linux's"
)
async def test_large_bodies_parse_at_the_loops_cpu_priority():
    """Not lower: the parsing thread holds the GIL inside C's JSON parser, and a thread the OS leaves
    waiting while the engine's cores are busy would hold the event loop with it (nice 19 beside two
    busy processes: the loop lagged up to 1.3 s, 27 ms at nice 0)."""

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert await parsed_off_the_loop(nice) == await off_the_loop(nice) == nice()


async def test_a_parse_whose_caller_left_keeps_the_turn_until_the_thread_is_done(
    caplog,
):
    """A caller that leaves while its body is parsed ends at once, but the next body still waits on the
    loop until the thread is free: it must not queue in the thread (holding its bytes) behind a slow
    parse. The abandoned parse's error is not logged as never retrieved."""
    started, release = threading.Event(), threading.Event()

    def busy():
        started.set()
        release.wait(10)
        raise ValueError("the body was not JSON")

    left = asyncio.ensure_future(parsed_off_the_loop(busy))
    await asyncio.to_thread(started.wait, 10)
    left.cancel()
    with pytest.raises(asyncio.CancelledError):
        await left
    following = asyncio.ensure_future(parsed_off_the_loop(len, "abc"))
    await asyncio.sleep(0.05)
    assert not following.done()
    assert concurrency._PARSING._work_queue.qsize() == 0  # waiting on the loop
    release.set()
    assert await following == 3
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def test_a_refused_parse_is_freed_without_the_collector():
    """A refusal raised on the parsing thread goes, with what its frames held (a gzip bomb's decoded
    pieces), as soon as it is handled: full collections are put off while bodies are parsed, and a
    cycle through it grew a server by 270 MiB in a flood of bombs."""
    held = []

    class Pieces:
        pass

    def refuse():
        pieces = Pieces()
        held.append(weakref.ref(pieces))
        raise ValueError("over the limit")

    gc.disable()
    try:
        with contextlib.suppress(ValueError):
            await parsed_off_the_loop(refuse)
        # the parsing thread drops its own reference to the refusal a moment after handing it
        # over (a while on a busy machine): wait for its next job, then for the
        # futures' done callbacks, which run on the next turns of the loop
        await parsed_off_the_loop(lambda: None)
        for _ in range(3):
            await asyncio.sleep(0)
        assert held[0]() is None
    finally:
        gc.enable()
