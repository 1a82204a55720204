# SPDX-License-Identifier: Apache-2.0
"""Whether the decision service can answer yet, and if not, what it is doing and how far along it is.

One object owns readiness: the startup work reports its steps and progress to it, the service asks it
(``check``) before every decision, bulk waits on it (``settled``), and the 503 a starting server answers
is its message. Progress is counted, never guessed: a step without a count says only its name, and a
process waiting for another API-server process's work says so.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from vllm.entrypoints.generate.decisions.decide.errors import (
    STARTING,
    DecisionError,
    NotReadyError,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

SELF_CHECK = "self-check"
CALIBRATION = "calibration"

LOG_EVERY_S = 10.0
# Reads done before the time left is estimated from them (calibration reads 8 at a time).
ESTIMATE_AFTER = 8
RETRY_AFTER_S = 5  # while the time left is unknown; with an estimate, that time within the bounds below
RETRY_AFTER_MAX_S = 15


@dataclass
class Progress:
    """A step's count: ``done`` of ``total`` ``unit`` since ``started`` (the clock's time)."""

    total: int
    unit: str
    started: float
    done: int = 0

    def seconds_left(self, now: float) -> float | None:
        """Estimated from the pace so far; None until enough is done to tell."""
        if self.done < min(ESTIMATE_AFTER, self.total) or self.done == 0:
            return None
        return (now - self.started) / self.done * (self.total - self.done)

    def describe(self, now: float) -> str:
        counted = f"{self.done} of {self.total} {self.unit}"
        if self.done >= self.total:
            return f"{counted}, fitting"
        left = self.seconds_left(now)
        return f"{counted}, " + (
            f"about {math.ceil(left)} s left"
            if left is not None
            else "time left unknown yet"
        )


class Readiness:
    """The decision service's startup state: the step running, its progress, ready, or why it failed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.step: str | None = None
        self.progress: Progress | None = None
        self.waiting_for_other = False  # another API-server process is doing this step
        self.ready = False
        self.failure: str | None = None
        self._logged = 0.0
        self._settled: asyncio.Event | None = None

    def begin(self, step: str) -> None:
        """A new step starts; nothing is known of its progress yet."""
        self.step, self.progress, self.waiting_for_other = step, None, False

    def waiting(self) -> None:
        """This process waits for another API-server process to do the current step."""
        self.waiting_for_other = self.step is not None and not self.finished

    def count(self, total: int, unit: str) -> None:
        """The current step is done here, in ``total`` ``unit`` (it is not waited for any more)."""
        self.waiting_for_other = False
        self.progress = Progress(total, unit, self.clock())
        self._logged = self.progress.started

    def advance(self, by: int = 1) -> None:
        """``by`` more of the current step's count are done. Logged when the time left is first known,
        then every ``LOG_EVERY_S`` seconds."""
        progress = self.progress
        if progress is None:
            return
        first_estimate = progress.done < ESTIMATE_AFTER <= progress.done + by
        progress.done += by
        now = self.clock()
        if (
            first_estimate or now - self._logged >= LOG_EVERY_S
        ) and progress.done < progress.total:
            self._logged = now
            logger.info("decision %s: %s", self.step, progress.describe(now))

    def succeed(self) -> None:
        self.ready, self.step, self.progress = True, None, None
        self._settle()

    def fail(self, reason: str) -> None:
        self.failure = reason
        self._settle()

    @property
    def finished(self) -> bool:
        """Ready, or failed for good."""
        return self.ready or self.failure is not None

    async def settled(self) -> None:
        """Wait until startup has finished, ready or failed (bulk waits here before its first line)."""
        if self.finished:
            return
        if self._settled is None:
            self._settled = asyncio.Event()
        await self._settled.wait()

    def _settle(self) -> None:
        if self._settled is not None:
            self._settled.set()

    def check(self) -> None:
        """Refuse while not ready: 503 with the reason after a failure, else 503 saying what is running."""
        if self.failure is not None:
            raise DecisionError(
                f"decisions are unavailable: {self.failure}",
                HTTPStatus.SERVICE_UNAVAILABLE,
            )
        if not self.ready:
            raise NotReadyError(self.message(), self.retry_after())

    def message(self) -> str:
        """What a starting server is doing, e.g. "decisions are starting: calibration, 120 of 300 questions
        read, about 40 s left"."""
        if self.step is None:
            return f"{STARTING}; retry shortly"
        if self.waiting_for_other:
            doing = f"waiting for another API-server process's {self.step}"
        elif self.progress is not None:
            doing = self.progress.describe(self.clock())
        else:
            doing = None
        return (
            f"{STARTING}: {self.step}"
            + (f", {doing}" if doing else "")
            + "; retry shortly"
        )

    def retry_after(self) -> int:
        """Seconds a client should wait: the time left where it is estimated (within 5 to 15 s), else 5."""
        left = (
            self.progress.seconds_left(self.clock())
            if self.progress and not self.waiting_for_other
            else None
        )
        if left is None:
            return RETRY_AFTER_S
        return min(max(math.ceil(left), RETRY_AFTER_S), RETRY_AFTER_MAX_S)
