# SPDX-License-Identifier: Apache-2.0
"""Whether the decision service can answer yet, and if not, what it is doing and how far along it is
(counted, never guessed: a step without a count says only its name)."""

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
    """``done`` of ``total`` ``unit`` since ``started`` (the clock's time)."""

    total: int
    unit: str
    started: float
    done: int = 0

    def seconds_left(self, now: float) -> float | None:
        if self.done < min(ESTIMATE_AFTER, self.total) or self.done == 0:
            return None
        return (now - self.started) / self.done * (self.total - self.done)

    def describe(self, now: float) -> str:
        counted = f"{self.done} of {self.total} {self.unit}"
        if self.done >= self.total:
            return f"{counted}, fitting"
        if (left := self.seconds_left(now)) is None:
            return f"{counted}, time left unknown yet"
        return f"{counted}, about {math.ceil(left)} s left"


class Readiness:
    """The startup state: the step running, its progress, ready, or why it failed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.step: str | None = None
        self.progress: Progress | None = None
        self.waiting_for_other = False  # another API-server process is doing this step
        self.ready = False
        self.failure: str | None = None
        self._logged = 0.0
        self._settled = asyncio.Event()

    def begin(self, step: str) -> None:
        self.step, self.progress, self.waiting_for_other = step, None, False

    def waiting(self) -> None:
        self.waiting_for_other = self.step is not None and not self.finished

    def count(self, total: int, unit: str) -> None:
        """The current step is done here (not waited for), in ``total`` ``unit``."""
        self.waiting_for_other = False
        self.progress = Progress(total, unit, self.clock())
        self._logged = self.progress.started

    def advance(self, by: int = 1) -> None:
        """Logged when the time left is first known, then every ``LOG_EVERY_S`` seconds."""
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
        self._settled.set()

    def fail(self, reason: str) -> None:
        self.failure = reason
        self._settled.set()

    @property
    def finished(self) -> bool:
        return self.ready or self.failure is not None

    async def settled(self) -> None:
        if not self.finished:
            await self._settled.wait()

    def check(self) -> None:
        if self.failure is not None:
            raise DecisionError(
                f"decisions are unavailable: {self.failure}",
                HTTPStatus.SERVICE_UNAVAILABLE,
            )
        if not self.ready:
            raise NotReadyError(self.message(), self.retry_after())

    def message(self) -> str:
        if self.step is None:
            return f"{STARTING}; retry shortly"
        doing = ""
        if self.waiting_for_other:
            doing = f", waiting for another API-server process's {self.step}"
        elif self.progress is not None:
            doing = f", {self.progress.describe(self.clock())}"
        return f"{STARTING}: {self.step}{doing}; retry shortly"

    def retry_after(self) -> int:
        progress = None if self.waiting_for_other else self.progress
        left = progress.seconds_left(self.clock()) if progress else None
        if left is None:
            return RETRY_AFTER_S
        return min(max(math.ceil(left), RETRY_AFTER_S), RETRY_AFTER_MAX_S)
