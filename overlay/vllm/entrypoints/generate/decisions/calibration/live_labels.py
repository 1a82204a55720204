# SPDX-License-Identifier: Apache-2.0
"""The labels file, watched while serving: on a change, question maps and thresholds refitted off the
request path, and a new :class:`Calibrated` put in force as one object (a request keeps its own)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.calibration.abstention import (
    question_thresholds,
)
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import (
    load,
    once_per_server,
)
from vllm.entrypoints.generate.decisions.calibration.fitting import question_name
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    Abstention,
    Calibrated,
    LabelledRead,
    QuestionMap,
    question_key,
)
from vllm.entrypoints.generate.decisions.calibration.maths import Labelled
from vllm.entrypoints.generate.decisions.calibration.question_map import question_maps
from vllm.entrypoints.generate.decisions.calibration.reads import WHILE_ANSWERING
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
    sha256_of,
)
from vllm.entrypoints.generate.decisions.decide.reading.corrections import Asked
from vllm.entrypoints.generate.decisions.decide.reading.read import plan_read, read
from vllm.entrypoints.generate.decisions.decide.reports import LABELS_FILE, STARTUP
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX, Settings
from vllm.logger import init_logger

logger = init_logger(__name__)

POLL_S = 5.0  # how often the file's size and mtime are looked at
KIND = "labels"  # the saved file: labels-<the calibration key's digest>.json


class SavedLabels(BaseModel):
    """What a refit saves: the file's name and hash, the maps fitted and every read so far."""

    labels_file: str
    sha256: str
    version: int
    maps: dict[str, QuestionMap]
    reads: list[LabelledRead]
    abstention: dict[str, Abstention] = Field(default_factory=dict)


def load_saved(settings: Settings, key: Any) -> SavedLabels | None:
    """The refit saved for this calibration ``key`` from this server's labels file, if any."""
    if not settings.labels or key is None:
        return None
    raw = load(Path(settings.calibration_dir), key, KIND)
    if raw is None:
        return None
    try:
        saved = SavedLabels.model_validate(raw)
    except ValidationError:
        logger.warning("decision labels: the saved run-time maps are malformed, unused")
        return None
    return saved if saved.labels_file == settings.labels else None


def restored(calibrated: Calibrated, settings: Settings) -> Calibrated:
    """``calibrated`` with the refit saved for it, if any (a restart)."""
    saved = load_saved(settings, calibrated.key)
    if saved is None:
        return calibrated
    logger.info(
        "decision labels: %d question maps of refit %d loaded from a saved result (%s)",
        len(saved.maps),
        saved.version,
        settings.labels,
    )
    return with_refit(calibrated, saved, calibrated.question_abstention)


def with_refit(
    calibrated: Calibrated, refit: SavedLabels, startup: Mapping[str, Abstention]
) -> Calibrated:
    """``refit``'s maps and thresholds over startup's (``startup``: its thresholds)."""
    maps = {k: m for k, m in calibrated.maps.items() if m.source == STARTUP}
    return replace(
        calibrated,
        maps={**maps, **refit.maps},
        maps_version=refit.version,
        question_abstention={**startup, **refit.abstention},
    )


class LiveLabels:
    def __init__(self, service: DecisionService, poll_s: float = POLL_S) -> None:
        self.service = service
        self.path = service.settings.labels
        self.poll_s = poll_s
        # The file's (mtime, size) when last looked at.
        self.seen: tuple[int, int] | None = None
        self.fitted_sha256: str | None = None
        # Reads by (state's SHA-256, question key): each labelled line is read once.
        self.reads: dict[tuple[str, str], LabelledRead] = {}
        saved = load_saved(service.settings, self.calibrated.key)
        # Startup's thresholds: a refit's are laid over these, not over the last refit's.
        self.startup_abstention = dict(self.calibrated.question_abstention)
        if saved is not None:
            self.fitted_sha256 = saved.sha256
            self.reads = {(r.state_sha256, r.question): r for r in saved.reads}
            for key in saved.abstention:
                self.startup_abstention.pop(key, None)

    @property
    def calibrated(self) -> Calibrated:
        """The record in force (``watch`` starts a watcher only where calibration put one there)."""
        calibrated = self.service.calibrated
        assert isinstance(calibrated, Calibrated)
        return calibrated

    async def run(self) -> None:
        """Look at the file every ``poll_s`` seconds until cancelled; a fault is not fatal."""
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception(
                    "decision labels: the refit failed; the maps in force stay"
                )
            await asyncio.sleep(self.poll_s)

    async def check(self) -> bool:
        """One look at the file; True where a refit put new maps in force."""
        try:
            stat = os.stat(self.path)
            seen: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            seen = None
        if seen == self.seen:
            return False
        self.seen = seen
        if seen is not None and seen[1] == 0:
            return False  # an empty file: no labels yet
        try:
            labels_file = await asyncio.to_thread(question_file.load, self.path)
        except question_file.QuestionFileError as exc:
            logger.warning(
                "decision labels (%sLABELS): %s; the question maps in force stay",
                PREFIX,
                exc,
            )
            return False
        if labels_file.sha256 == self.fitted_sha256:
            return False
        calibrated = self.calibrated
        if calibrated.key is None:  # no saved calibration to share the refit under
            return self._apply(await self._refit(labels_file), loaded=False)
        settings = self.service.settings

        async def measured() -> dict[str, Any]:
            return (await self._refit(labels_file)).model_dump()

        # One API-server process of this server refits; the others wait for its saved refit.
        record, loaded = await once_per_server(
            Path(settings.calibration_dir),
            dict(calibrated.key),
            KIND,
            settings.startup_wait,
            measured,
            lambda saved: (
                saved.get("labels_file") == self.path
                and saved.get("sha256") == labels_file.sha256
            ),
        )
        try:
            refit = SavedLabels.model_validate(record)
        except ValidationError:
            logger.warning(
                "decision labels: a malformed saved refit; the maps in force stay"
            )
            return False
        return self._apply(refit, loaded)

    async def _refit(self, labels_file: question_file.QuestionFile) -> SavedLabels:
        """The next refit, not yet in force."""
        fresh = [item for item in labels_file.questions if _key(item) not in self.reads]
        await self._read(fresh)
        rows = [
            (item, self.reads[_key(item)])
            for item in labels_file.questions
            if _key(item) in self.reads
        ]
        # A question the calibration file labelled too is refitted on its labels from both files.
        startup = pooled(self.calibrated.labelled, [_key(item) for item, _ in rows])
        both = [(item.correct, item.group, read) for item, read in rows] + startup
        keys = [read.question for _, _, read in both]
        scales = [read.scale for _, _, read in both]
        labelled = Labelled(
            [read.scores for _, _, read in both],
            [correct for correct, _, _ in both],
            [group for _, group, _ in both],
        )
        maps = await asyncio.to_thread(question_maps, keys, labelled, scales)
        thresholds = await asyncio.to_thread(
            question_thresholds, keys, labelled, scales, maps, labels_file.precisions()
        )
        version = self.calibrated.maps_version + 1
        logger.info(
            "decision labels: refit %d from %s: %d new lines read (%d in all, with %d labels of "
            "the same questions from the calibration file), %d question maps kept",
            version,
            self.path,
            len(fresh),
            len(rows),
            len(startup),
            len(maps),
        )
        source = f"decision labels: refit {version}"
        for key, rule in thresholds.items():
            line = rule.log_line(question_name(key), source)
            (logger.info if rule.threshold is not None else logger.warning)("%s", line)
        return SavedLabels(
            labels_file=self.path,
            sha256=labels_file.sha256,
            version=version,
            maps={
                key: qmap.model_copy(update={"version": version, "source": LABELS_FILE})
                for key, qmap in maps.items()
            },
            reads=list(self.reads.values()),
            abstention=thresholds,
        )

    def _apply(self, refit: SavedLabels, loaded: bool) -> bool:
        """``refit`` over startup's maps and thresholds; ``loaded``: its reads are adopted."""
        self.service.calibrated = with_refit(
            self.calibrated, refit, self.startup_abstention
        )
        self.fitted_sha256 = refit.sha256
        if loaded:
            self.reads = {(r.state_sha256, r.question): r for r in refit.reads}
            logger.info(
                "decision labels: refit %d from %s loaded from another API-server process "
                "(%d question maps)",
                refit.version,
                self.path,
                len(refit.maps),
            )
        return True

    async def _read(self, items: list[question_file.LabelledQuestion]) -> None:
        """Each line read as a request reads it without a map (failures retried on the next change)."""
        service, gate = self.service, asyncio.Semaphore(WHILE_ANSWERING)
        without_maps = replace(self.calibrated, maps={}, examples={})
        asked = Asked(service.settings.debias)
        # Request ids unique to this refit: a later one, or another process, may read a line again.
        refit = uuid.uuid4().hex[:8]

        async def one(index: int, item: question_file.LabelledQuestion) -> None:
            how = without_maps.resolve(item.question, asked, service.corrections)
            if how.temperature.source != "calibrated":
                return  # no map applies to this question's reads
            context = replace(
                ReadContext.about(
                    item.state,
                    f"decision-labels-{refit}-{index}",
                    service.backend.options,
                ),
                adapter=service.adapter,
            )
            plan = plan_read(service.backend, item.question, context, asked.debias, how)
            async with gate:
                try:
                    done = await read(plan)
                except DecisionError as exc:
                    logger.debug("decision labels: %s skipped: %s", item.id, exc)
                    return
            state, key = _key(item)
            self.reads[state, key] = LabelledRead(
                state_sha256=state,
                question=key,
                scores=done.scores,
                scale=1.0 / how.temperature.value,
            )

        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))


def pooled(
    startup: Sequence[LabelledRead], lines: Sequence[tuple[str, str]]
) -> list[tuple[int, str, LabelledRead]]:
    """Startup's labelled reads of the file's questions, but of inputs it labels itself."""
    own = set(lines)
    asked = {question for _, question in own}
    return [
        (read.correct, read.group, read)
        for read in startup
        if read.question in asked
        and (read.state_sha256, read.question) not in own
        and read.correct is not None
        and read.group is not None
    ]


def _key(item: question_file.LabelledQuestion) -> tuple[str, str]:
    return sha256_of(item.state), question_key(item.question)


def watch(
    service: DecisionService, poll_s: float = POLL_S
) -> asyncio.Task[None] | None:
    """The watcher as a task the service holds (and cancels on close), if it has one to run."""
    if not service.settings.labels or service.calibrated.stage is None:
        return None
    task = asyncio.create_task(LiveLabels(service, poll_s).run())
    service.background.add(task)
    task.add_done_callback(service.background.discard)
    return task
