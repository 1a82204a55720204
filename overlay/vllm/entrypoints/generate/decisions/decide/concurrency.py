# SPDX-License-Identifier: Apache-2.0
"""Running a request's reads together, and stopping all of them when one can't go on; its pure-Python
preparation off the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# One thread for every request's parsing and rendering. Under the GIL more threads would add no speed,
# only more turns to wait: ten hostile bodies rendering side by side kept the event loop (/health,
# every other client) waiting up to 0.4 s for the GIL; beside one thread it waits at most one switch.
_PREPARING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decisions-prepare")
# Large bodies are parsed on a thread of their own: a small request's preparation never waits behind
# them (a 4 MiB body of empty objects takes a quarter of a second to parse). They wait their turn on
# the event loop, not in the thread's queue: a cancelled wait lets go of its body at once, where a
# cancelled job in the queue would hold it until the thread reached it.
_PARSING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decisions-parse")
_PARSING_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def off_the_loop(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` on the one preparing thread, so the event loop keeps answering meanwhile."""
    return await _on(_PREPARING, work, *args)


async def parsed_off_the_loop(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` on the parsing thread, one at a time; cancelled before its turn (its client
    left), it never runs, and what it holds is let go."""
    turn = _PARSING_TURNS.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with turn:
        return await _on(_PARSING, work, *args)


async def _on(thread: ThreadPoolExecutor, work: Callable[..., T], *args: object) -> T:
    call = contextvars.copy_context().run
    return await asyncio.get_running_loop().run_in_executor(thread, call, work, *args)


async def gather_or_cancel(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Like ``asyncio.gather``, but when one raises, the others are cancelled (which aborts their
    engine requests) before the exception goes on: no read outlives the request that asked for it."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except Exception:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
