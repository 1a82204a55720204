# SPDX-License-Identifier: Apache-2.0
"""Startup work done once per deployment, not once per API-server process.

``vllm serve --api-server-count N`` runs N API-server processes, each with its own decision service.
Work whose result is saved (the backend's startup checks, the calibration) runs under an exclusive
lock on a file beside the saved result: the first process to get the lock does the work and saves it;
the others wait (answering 503 meanwhile), then load it. The lock is the operating system's
(``flock``), so it goes with the process holding it: a crash frees it for the next waiter. A process
that has waited ``VLLM_TYPED_DECISIONS_STARTUP_WAIT`` seconds for a live but stuck holder stops
waiting and does the work itself.

Processes of one deployment that share no folder (Ray Data actors on several nodes, bulk/ray_data.py)
also hand each other the records through the :class:`SharedRecords` this process is given
(:func:`share_records`): one of them does the work, and the others wait for its record there.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from vllm.entrypoints.generate.decisions.decide.calibration import store
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX
from vllm.logger import init_logger

logger = init_logger(__name__)

POLL_S = 0.25


@asynccontextmanager
async def exclusive(
    path: Path, wait_s: float, what: str, waiting: Callable[[], None] | None = None
) -> AsyncIterator[bool]:
    """Hold the lock at ``path`` for the block; yields False when going ahead without it (the folder
    can't hold a lock file, or ``wait_s`` ran out). ``waiting`` is told when another process holds it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        logger.warning(
            "decision %s: no lock file at %s (%s); other API-server processes may repeat it",
            what,
            path,
            exc,
        )
        yield False
        return
    try:
        held = await _acquire(fd, wait_s, what, waiting)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


async def _acquire(
    fd: int, wait_s: float, what: str, waiting: Callable[[], None] | None
) -> bool:
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if not announced:
            logger.info(
                "decision %s: another API-server process is doing it; waiting for its result",
                what,
            )
            if waiting is not None:
                waiting()
            announced = True
        if time.monotonic() >= deadline:
            logger.warning(
                "decision %s: waited %g s for another API-server process (%sSTARTUP_WAIT); "
                "doing it here",
                what,
                wait_s,
                PREFIX,
            )
            return False
        await asyncio.sleep(POLL_S)


class SharedRecords(Protocol):
    """Startup records handed between the processes of one deployment that share no folder."""

    async def take(self, name: str, wait_s: float) -> dict[str, Any] | None:
        """The record ``name`` another process made; None when this process is to make it (no other is
        making it, or the one making it failed or took over ``wait_s`` seconds)."""
        ...

    async def give(self, name: str, record: dict[str, Any] | None) -> None:
        """The record this process made (None: making it failed, so a waiting process makes it)."""
        ...


_SHARED: SharedRecords | None = None


def share_records(shared: SharedRecords | None) -> None:
    """Take this process's startup records from, and give them to, ``shared``: one per process, as its
    run id is (bulk/ray_data.py sets it in each actor)."""
    global _SHARED
    _SHARED = shared


async def once_per_server(
    directory: Path,
    key: dict[str, Any],
    kind: str,
    wait_s: float,
    produce: Callable[[], Awaitable[dict[str, Any]]],
    reusable: Callable[[dict[str, Any]], bool],
    waiting: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The record of ``kind`` for ``key``, and whether it was loaded: a saved record that ``reusable``
    accepts (made by another API-server process of this server, or for calibration by an earlier
    run), else one ``produce`` makes now and saves for the others. Under the lock, so one process
    produces while the others wait (``waiting`` is told when this one waits)."""
    async with exclusive(store.lock_path(directory, key, kind), wait_s, kind, waiting):
        saved = store.load(directory, key, kind)
        if saved is not None and reusable(saved):
            return saved, True
        name = store.path_for(directory, key, kind).stem
        if (
            _SHARED is not None
            and (shared := await _SHARED.take(name, wait_s)) is not None
            and reusable(shared)
        ):
            logger.info(
                "decision %s: adopting the record another process of this deployment made",
                kind,
            )
            save(directory, key, shared, kind)
            return shared, True
        record: dict[str, Any] | None = None
        try:
            record = await produce()
        finally:
            # given even when producing raised, so that a waiting process takes over
            if _SHARED is not None:
                await _SHARED.give(name, record)
        save(directory, key, record, kind)
        return record, False


def save(
    directory: Path, key: dict[str, Any], record: dict[str, Any], kind: str
) -> None:
    """Save ``record`` for ``key``, logged; a folder that can't hold it is a warning, never a stop."""
    try:
        logger.info(
            "decision %s saved to %s", kind, store.save(directory, key, record, kind)
        )
    except OSError as exc:
        logger.warning(
            "decision %s not saved (%sCALIBRATION_DIR=%s): %s",
            kind,
            PREFIX,
            directory,
            exc,
        )


def this_run(record: dict[str, Any]) -> bool:
    """Whether a saved record was made by this server run."""
    return record.get("run") == run_id()


_RUN: str | None = None
_NAMED = False  # named by name_run, which identify_run then leaves alone


def name_run(name: str) -> None:
    """Name this run outright: processes of one deployment that are not one server's children (the
    actors of one Ray job) share the name their launcher gives them."""
    global _RUN, _NAMED
    _RUN, _NAMED = name, True


def identify_run(api_server_count: int | None) -> None:
    """Name this server run, once at startup: the API-server processes of ``vllm serve
    --api-server-count N`` (N > 1) are children of the one ``vllm serve`` process; a single API server
    is that process itself. A pid with its start time, so a reused pid is another run."""
    global _RUN
    if _NAMED:
        return
    pid = os.getppid() if (api_server_count or 1) > 1 else os.getpid()
    _RUN = f"{pid}-{_start_time(pid)}"


def run_id() -> str:
    """What the API-server processes of one server share and a restart doesn't."""
    return _RUN or f"{os.getpid()}-{_start_time(os.getpid())}"


def _start_time(pid: int) -> str:
    try:  # /proc/PID/stat: the 22nd field, counted after the command name in parentheses
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "unknown"
