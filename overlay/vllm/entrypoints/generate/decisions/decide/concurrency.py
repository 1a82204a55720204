# SPDX-License-Identifier: Apache-2.0
"""A request's reads run together and stop together; its pure-Python preparation runs off the loop."""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Prompts render on one thread (more add only GIL waits); large bodies (4 MiB of empty objects: 0.25 s)
# parse on another, each waiting its turn on the loop, so a cancelled wait lets go of its body. Not at a
# lower CPU priority: a thread that holds the GIL in C's JSON parser while the OS runs a busy engine
# instead stalls the loop (nice 19 beside two busy cores: loop lag up to 1.3 s, 27 ms at nice 0).
_PREPARING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decisions-prepare")
_PARSING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decisions-parse")
_PARSING_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def off_the_loop(work: Callable[..., T], *args: object) -> T:
    return await _on(_PREPARING, work, *args)


async def parsed_off_the_loop(work: Callable[..., T], *args: object) -> T:
    """The turn ends when the thread is done, not when a caller that left stops waiting: else the next
    bodies queued behind a slow parse, each held there (a hang-up flood peaked at 0.8 GB)."""
    turn = _PARSING_TURNS.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    await turn.acquire()
    job = _on(_PARSING, work, *args)

    def end_turn(done: asyncio.Future[T]) -> None:
        turn.release()
        if not done.cancelled():
            done.exception()  # retrieved: a caller that left does not, and asyncio would log it

    job.add_done_callback(end_turn)
    try:
        return await asyncio.shield(job)
    finally:
        # else a refusal's traceback holds this frame, which holds the job holding the refusal
        del job


def _on(
    thread: ThreadPoolExecutor, work: Callable[..., T], *args: object
) -> asyncio.Future[T]:
    call = contextvars.copy_context().run
    return asyncio.get_running_loop().run_in_executor(thread, call, work, *args)


async def gather_or_cancel(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """``asyncio.gather`` that cancels the others (aborting their engine reads) when one raises."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except Exception:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
