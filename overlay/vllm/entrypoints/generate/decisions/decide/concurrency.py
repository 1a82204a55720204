# SPDX-License-Identifier: Apache-2.0
"""Running a request's reads together, and stopping all of them when one can't go on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


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
