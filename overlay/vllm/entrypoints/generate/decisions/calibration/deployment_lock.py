# SPDX-License-Identifier: Apache-2.0
"""Startup work done once per deployment, not per API-server process: under a ``flock`` (freed by a
crash) beside the saved result, or through :class:`SharedRecords` where processes share no folder.
Results are saved one JSON file per deployment and kind, reused only on an exact key match."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

from vllm.entrypoints.generate.decisions.decide.settings import PREFIX
from vllm.logger import init_logger

logger = init_logger(__name__)

POLL_S = 0.25


@asynccontextmanager
async def exclusive(
    path: Path, wait_s: float, what: str, waiting: Callable[[], None] | None = None
) -> AsyncIterator[bool]:
    """Hold the lock for the block; yields False when going ahead without it."""
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
        with suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
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
    async def take(self, name: str, wait_s: float) -> dict[str, Any] | None:
        """The record ``name`` another process made; None: this process is to make it."""

    async def give(self, name: str, record: dict[str, Any] | None) -> None:
        """The record this process made (None: it failed, so a waiting process makes it)."""


_SHARED: SharedRecords | None = None


def share_records(shared: SharedRecords | None) -> None:
    """Exchange this process's startup records through ``shared`` (set per Ray actor, as its run id)."""
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
    """The record of ``kind`` for ``key``, and whether it was loaded rather than produced here."""
    path = path_for(directory, key, kind)
    # The lock beside the saved result, held by the one API-server process producing it.
    async with exclusive(path.with_suffix(".lock"), wait_s, kind, waiting):
        saved = load(directory, key, kind)
        if saved is not None and reusable(saved):
            return saved, True
        name = path.stem
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


def path_for(directory: Path, key: dict[str, Any], kind: str = "calibration") -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
    return directory / f"{kind}-{digest.hexdigest()[:20]}.json"


def load(
    directory: Path, key: dict[str, Any], kind: str = "calibration"
) -> dict[str, Any] | None:
    """The saved result for exactly this key, or None."""
    try:
        record = json.loads(path_for(directory, key, kind).read_text())
    except (OSError, ValueError):
        return None
    same = json.loads(json.dumps(key, default=str))
    return record if isinstance(record, dict) and record.get("key") == same else None


def save(
    directory: Path,
    key: dict[str, Any],
    record: dict[str, Any],
    kind: str = "calibration",
) -> None:
    """Atomically, so a crash mid-write never leaves a half file to be trusted later; a folder that
    can't hold ``record`` is a warning, never a stop."""
    path = path_for(directory, key, kind)
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary.write_text(
            json.dumps({**record, "key": key}, indent=2, default=str) + "\n"
        )
        temporary.replace(path)
    except OSError as exc:
        logger.warning(
            "decision %s not saved (%sCALIBRATION_DIR=%s): %s",
            kind,
            PREFIX,
            directory,
            exc,
        )
        return
    logger.info("decision %s saved to %s", kind, path)


def this_run(record: dict[str, Any]) -> bool:
    return record.get("run") == run_id()


_RUN: str | None = None
_NAMED = False  # named by name_run, which identify_run then leaves alone


def name_run(name: str) -> None:
    """Name this run outright: for processes that are not one server's children (one Ray job's)."""
    global _RUN, _NAMED
    _RUN, _NAMED = name, True


def identify_run(api_server_count: int | None) -> None:
    """The ``vllm serve`` parent of N > 1 API servers, else this process; with its start time, so a
    reused pid is another run."""
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
