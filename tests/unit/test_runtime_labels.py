"""Labels while serving (issue 40, item 2): a labels file the server watches (VLLM_TYPED_DECISIONS_LABELS)
refits a question's map in the background from the next request on, never during one; each line is
read once; a malformed file keeps the maps in force; the refit is saved and a restart answers with it.
The backend is a fake (test_operator_labels.py's), so the lean it puts on one question is known."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import question_key
from vllm.entrypoints.generate.decisions.calibration.live_labels import (
    LiveLabels,
    watch,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.runtime.startup import start_service

from .test_calibration_startup import MODEL
from .test_operator_labels import MOOD, PRIORITY, TEAM, LeansOnOneQuestion, compiled

ASKED = "a new request about high"


def lines(question: dict, noun: str, values: tuple[str, ...], count: int, start=0):
    """``count`` labelled lines about ``question``, the answers cycling through ``values``."""
    return [
        json.dumps(
            {
                "state": f"{noun} {i} about {values[i % len(values)]}",
                "question": question,
                "expected": values[i % len(values)],
                "group": f"{noun}{i}",
            }
        )
        for i in range(start, start + count)
    ]


def write(path, rows: list[str]) -> None:
    path.write_text("".join(row + "\n" for row in rows))


class Counting(LeansOnOneQuestion):
    """Counts the label reads; once ``hold`` is set, a request about :data:`ASKED` waits for
    ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.label_reads: list[str] = []
        self.hold = False
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def read(self, question, context):
        if context.request_id.startswith("decision-labels"):
            self.label_reads.append(context.state)
        elif self.hold and context.state == ASKED:
            self.waiting.set()
            await self.release.wait()
        return await super().read(question, context)


async def served(tmp_path, backend=None, startup=()):
    """A service calibrated at startup on team and mood labels (no priority question unless
    ``startup`` has some lines), watching ``labels.jsonl`` (empty)."""
    calibration = tmp_path / "calibration.jsonl"
    teams = ("billing", "sales", "technical")
    write(
        calibration,
        lines(TEAM, "ticket", teams, 120)
        + lines(MOOD, "note", ("calm", "cross", "glad"), 5)
        + list(startup),
    )
    labels = tmp_path / "labels.jsonl"
    if not labels.exists():
        labels.write_text("")
    configured = Settings.from_env(
        {
            "VLLM_TYPED_DECISIONS_CALIBRATION": str(calibration),
            "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
            "VLLM_TYPED_DECISIONS_PRIOR": "off",
            "VLLM_TYPED_DECISIONS_LABELS": str(labels),
        }
    )
    backend = backend or Counting()
    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return await startup_calibration(backend, configured, MODEL)

    await service.start(calibrate)
    return service, backend, labels


async def answer(service, state=ASKED):
    (result,) = (await service.decide(ask(state, [compiled(PRIORITY)]))).results
    return result


PRIORITIES = ("low", "medium", "high")


async def test_a_label_added_applies_from_the_next_request(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    service, backend, labels = await served(tmp_path)
    watcher = LiveLabels(service, poll_s=0)
    assert not await watcher.check(), "an empty file: nothing to fit"
    before = await answer(service)
    assert before.audit.question_map is None
    assert before.audit.temperature_scope == "choice"

    write(labels, lines(PRIORITY, "request", PRIORITIES, 30))
    assert await watcher.check()
    assert len(backend.label_reads) == 30
    assert service.calibrated.maps_version == 1
    own = service.calibrated.maps[question_key(compiled(PRIORITY))]
    assert (own.version, own.source, own.labels) == (1, "labels file", 30)
    assert own.bias[0] == min(own.bias), "the lean toward low taken out"
    after = await answer(service)
    audit = after.audit
    assert audit.temperature_scope == "choice:question"
    assert audit.question_map is not None
    assert (audit.question_map.version, audit.question_map.source) == (
        1,
        "labels file",
    )
    assert audit.as_json()["question_map"]["source"] == "labels file"
    assert after.fields["choice"] == "high"
    assert (
        "decision labels: refit 1 from "
        f"{labels}: 30 new lines read (30 in all, with 0 labels of the same questions from "
        "the calibration file), 1 question maps kept" in caplog.text
    )
    assert not await watcher.check(), "no change, no refit"

    # A second change reads only the new lines, refits from all of them: version 2.
    write(
        labels,
        lines(PRIORITY, "request", PRIORITIES, 30)
        + lines(PRIORITY, "request", PRIORITIES, 9, start=30),
    )
    assert await watcher.check()
    assert len(backend.label_reads) == 39
    assert len(set(backend.label_reads)) == 39, "each line read once"
    again = (await answer(service)).audit.question_map
    assert again is not None and (again.version, again.labels) == (2, 39)

    # Saved beside the calibration record, under its key.
    (record,) = (tmp_path / "saved").glob("calibration-*.json")
    (saved,) = (tmp_path / "saved").glob("labels-*.json")
    assert saved.name.removeprefix("labels-") == record.name.removeprefix(
        "calibration-"
    )
    content = json.loads(saved.read_text())
    assert content["version"] == 2 and len(content["reads"]) == 39


async def test_a_question_in_both_files_is_refitted_on_the_labels_of_both(
    tmp_path, caplog
):
    """6 priority labels in the calibration file are too few for a map; 6 more in the labels
    file (one of them an input the calibration file labelled too, which counts once, with the
    labels file's answer) make 11, enough: the refit pools them."""
    caplog.set_level(logging.INFO)
    startup = lines(PRIORITY, "request", PRIORITIES, 6)
    service, backend, labels = await served(tmp_path, startup=startup)
    key = question_key(compiled(PRIORITY))
    assert key not in service.calibrated.maps, "6 labels: too few at startup"
    kept = [r for r in service.calibrated.labelled if r.question == key]
    assert len(kept) == 6 and {r.group for r in kept} == {
        f"request{i}" for i in range(6)
    }
    write(labels, lines(PRIORITY, "request", PRIORITIES, 6, start=5))
    assert await LiveLabels(service, poll_s=0).check()
    assert len(backend.label_reads) == 6, "startup's reads are not read again"
    own = service.calibrated.maps[key]
    assert (own.labels, own.source) == (11, "labels file")
    assert "6 new lines read (6 in all, with 5 labels of the same questions" in (
        caplog.text
    )
    # Saved in the calibration record, so a restart pools them too.
    (record,) = (tmp_path / "saved").glob("calibration-*.json")
    saved = json.loads(record.read_text())["labelled"]
    assert sum(r["question"] == key for r in saved) == 6


async def test_one_api_server_process_refits_and_the_others_load_it(tmp_path, caplog):
    """Two API-server processes of one server (one calibration record) watch the same file: the
    first to see the change reads and refits; the other loads that refit, reading nothing, and
    answers with the same maps; a line added later is read once, by whichever refits."""
    caplog.set_level(logging.INFO)
    first, first_backend, labels = await served(tmp_path)
    second, second_backend, _ = await served(tmp_path, Counting())
    assert first.calibrated.key == second.calibrated.key
    watchers = LiveLabels(first, poll_s=0), LiveLabels(second, poll_s=0)
    write(labels, lines(PRIORITY, "request", PRIORITIES, 30))
    assert await watchers[0].check() and await watchers[1].check()
    assert len(first_backend.label_reads) == 30 and second_backend.label_reads == []
    assert second.calibrated.maps == first.calibrated.maps
    assert second.calibrated.maps_version == first.calibrated.maps_version == 1
    assert (
        "refit 1 from " in caplog.text
        and "loaded from another API-server process" in (caplog.text)
    )
    write(
        labels,
        lines(PRIORITY, "request", PRIORITIES, 30)
        + lines(PRIORITY, "request", PRIORITIES, 1, start=30),
    )
    assert await watchers[1].check() and await watchers[0].check()
    assert second_backend.label_reads == ["request 30 about low"], "only the new line"
    assert len(first_backend.label_reads) == 30
    assert first.calibrated.maps == second.calibrated.maps
    assert first.calibrated.maps_version == 2


async def test_a_request_in_flight_keeps_the_maps_it_started_with(tmp_path):
    service, backend, labels = await served(tmp_path)
    watcher = LiveLabels(service, poll_s=0)
    backend.hold = True
    started = asyncio.ensure_future(answer(service))
    await backend.waiting.wait()
    write(labels, lines(PRIORITY, "request", PRIORITIES, 30))
    assert await watcher.check()
    assert service.calibrated.maps_version == 1
    backend.release.set()
    held = await started
    assert held.audit.question_map is None, "started before the refit: no map"
    assert held.audit.temperature_scope == "choice"
    later = (await answer(service)).audit.question_map
    assert later is not None and later.version == 1


async def test_a_malformed_file_keeps_the_maps_and_warns(tmp_path, caplog):
    service, backend, labels = await served(tmp_path)
    watcher = LiveLabels(service, poll_s=0)
    write(labels, lines(PRIORITY, "request", PRIORITIES, 30))
    assert await watcher.check()
    in_force = service.calibrated
    write(labels, [*lines(PRIORITY, "request", PRIORITIES, 30), "{not json"])
    assert not await watcher.check()
    assert service.calibrated is in_force
    assert "decision labels (VLLM_TYPED_DECISIONS_LABELS): line 31" in caplog.text
    assert "the question maps in force stay" in caplog.text


async def test_a_restart_answers_with_the_saved_refit(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    service, backend, labels = await served(tmp_path)
    write(labels, lines(PRIORITY, "request", PRIORITIES, 30))
    assert await LiveLabels(service, poll_s=0).check()
    fitted = service.calibrated.maps

    restarted, fresh, _ = await served(tmp_path, Counting())
    assert restarted.calibrated.maps_version == 1
    assert restarted.calibrated.maps == fitted
    assert "decision labels: 1 question maps of refit 1 loaded" in caplog.text
    audit = (await answer(restarted)).audit.question_map
    assert audit is not None and (audit.version, audit.source) == (1, "labels file")
    # Nothing to read again for the same file; a line added is the only one read.
    watcher = LiveLabels(restarted, poll_s=0)
    assert not await watcher.check() and fresh.label_reads == []
    write(
        labels,
        lines(PRIORITY, "request", PRIORITIES, 30)
        + lines(PRIORITY, "request", PRIORITIES, 1, start=30),
    )
    assert await watcher.check()
    assert fresh.label_reads == ["request 30 about low"]
    assert restarted.calibrated.maps_version == 2


async def test_a_precision_in_the_labels_file_refits_that_questions_threshold(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    service, backend, labels = await served(tmp_path)
    assert (await answer(service)).abstention is None, "no precision asked yet"
    asked = [
        json.dumps(json.loads(row) | {"precision": 0.8})
        for row in lines(PRIORITY, "request", PRIORITIES, 60)
    ]
    write(labels, asked)
    assert await LiveLabels(service, poll_s=0).check()
    key = question_key(compiled(PRIORITY))
    rule = service.calibrated.question_abstention[key]
    assert (rule.scope, rule.precision_asked, rule.labels) == ("question", 0.8, 60)
    assert rule.threshold is not None, "read under its refitted map, the lean is out"
    verdict = (await answer(service)).abstention
    assert verdict is not None and (verdict.scope, verdict.threshold) == (
        "question",
        rule.threshold,
    )
    assert "decision labels: refit 1 (choice, 'Which priority?'): precision 0.8" in (
        caplog.text
    )
    # Saved with the refit: a restart judges answers by it from the start.
    restarted, _, _ = await served(tmp_path, Counting())
    assert restarted.calibrated.question_abstention == {key: rule}
    # A file that no longer asks the precision takes the question's threshold away.
    write(labels, lines(PRIORITY, "request", PRIORITIES, 60))
    assert await LiveLabels(restarted, poll_s=0).check()
    assert restarted.calibrated.question_abstention == {}
    assert (await answer(restarted)).abstention is None


async def test_the_watcher_runs_in_the_background_and_stops_on_close(tmp_path):
    service, backend, labels = await served(tmp_path)
    task = watch(service, poll_s=0.01)
    assert task is not None and task in service.background
    write(labels, lines(PRIORITY, "request", PRIORITIES, 30))
    for _ in range(500):
        if service.calibrated.maps_version:
            break
        await asyncio.sleep(0.01)
    assert service.calibrated.maps_version == 1
    service.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not service.background


async def test_startup_starts_the_watcher_once_calibrated(tmp_path):
    """runtime/startup.py's start_service: calibration, then the watcher as the service's
    background work."""
    service, _, _ = await served(tmp_path)
    fresh = DecisionService(service.settings, Counting(), "served")
    fresh.deployment = MODEL
    await start_service(fresh)
    assert fresh.readiness.ready and fresh.calibrated.stage == "full"
    assert fresh.calibrated.key is not None and len(fresh.background) == 1
    (task,) = fresh.background
    fresh.close()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert task.cancelled() and not fresh.background


async def test_no_watcher_without_a_labels_file_or_a_calibration(tmp_path):
    off = DecisionService(Settings.from_env({}), LeansOnOneQuestion(), "served")
    assert watch(off) is None
