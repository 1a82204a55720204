"""A stop during startup work (the server shutting down under its calibration) logs one line saying
what it cut short, never an error, while a fault still logs one; a first pass is saved, so the start
after a stop during the full calibration answers on it at once and finishes the full one."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from vllm.entrypoints.generate.decisions.calibration.in_force import Calibrated
from vllm.entrypoints.generate.decisions.decide.engine.vllm_host import VllmHost
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.runtime.startup import (
    cut_short,
    start_service,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from .test_first_pass import HeldBackend, audit_of, configured, until

PACKAGE = "vllm.entrypoints.generate.decisions"


def package_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(PACKAGE)]


def stop_lines(caplog) -> list[logging.LogRecord]:
    """The lines a stop logs, after making sure it logged no error and no traceback."""
    records = package_records(caplog)
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
    return [r for r in records if " cancelled" in r.message or " stopped" in r.message]


def serving(settings, backend: HeldBackend) -> DecisionService:
    """A service whose calibration reads are held from the moment a first pass is in force."""
    service = DecisionService(settings, backend, "served")
    put_in_force = service.use_first_pass

    def first_pass(calibrated: Calibrated) -> None:
        backend.hold = True
        put_in_force(calibrated)

    service.use_first_pass = first_pass
    return service


async def test_a_stop_during_the_first_pass_logs_one_line_and_no_error(
    tmp_path, caplog
):
    backend = HeldBackend()
    backend.hold = True
    service = DecisionService(configured(tmp_path), backend, "served")
    starting = asyncio.create_task(start_service(service))
    await until(lambda: backend.calibration_reads)
    starting.cancel()  # as the end of vllm serve's event loop cancels it
    await asyncio.gather(starting, return_exceptions=True)
    (line,) = stop_lines(caplog)
    progress = service.readiness.progress
    assert progress is not None and progress.unit == "first-pass reads"
    assert line.levelno == logging.INFO
    # Reads sent to the engine count, answered or not (the 8 held and cancelled here).
    assert line.message == (
        f"decision calibration cancelled after {progress.done} of {progress.total} first-pass "
        "reads"
    )
    assert not list((tmp_path / "saved").glob("*pass*.json")), "nothing fitted yet"


async def test_a_start_after_a_stop_during_the_full_calibration_answers_on_the_saved_first_pass(
    tmp_path, caplog
):
    settings = configured(tmp_path)
    first = serving(settings, HeldBackend())
    starting = asyncio.create_task(start_service(first))
    await until(lambda: first.readiness.ready)
    fitted = first.calibrated
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    (line,) = stop_lines(caplog)
    assert line.message.startswith(
        "decision calibration cancelled during the full calibration; its first pass is saved"
    )
    saved = tmp_path / "saved"
    assert len(list(saved.glob("first-pass-*.json"))) == 1
    assert not list(saved.glob("calibration-*.json"))

    # The next start: ready while every calibration read is held, so on the saved first pass alone.
    caplog.clear()
    backend = HeldBackend()
    backend.hold = True
    again = DecisionService(settings, backend, "served")
    restarting = asyncio.create_task(start_service(again))
    await until(lambda: again.readiness.ready)
    assert again.temperatures == fitted.temperatures
    audit = await audit_of(again)
    assert (audit.calibration_stage, audit.calibration_reads) == (
        "first pass",
        fitted.question_reads,
    )
    assert "loaded from a saved result" in caplog.text
    assert "reading a first pass" not in caplog.text
    # The full calibration, in the background, reads every question once and replaces it.
    backend.release.set()
    await restarting
    audit = await audit_of(again)
    assert audit.calibration_stage == "full"
    assert "the full calibration replaces the first pass" in caplog.text
    real = [r for r in backend.calibration_reads if r[0].startswith("ticket ")]
    assert len(real) == len(set(real)) == audit.calibration_reads
    assert len(list(saved.glob("calibration-*.json"))) == 1

    # A saved full calibration wins: the start after that loads it, with no first pass.
    caplog.clear()
    third = DecisionService(settings, HeldBackend(), "served")
    await start_service(third)
    assert (await audit_of(third)).calibration_stage == "full"
    assert "first-pass" not in caplog.text


async def test_the_saved_first_pass_waits_when_the_setting_is_off(tmp_path):
    settings = configured(tmp_path)
    first = serving(settings, HeldBackend())
    starting = asyncio.create_task(start_service(first))
    await until(lambda: first.readiness.ready)
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)

    off = configured(tmp_path, first_pass="off")
    backend = HeldBackend()
    backend.hold = True
    service = DecisionService(off, backend, "served")
    starting = asyncio.create_task(start_service(service))
    await until(lambda: backend.calibration_reads)
    assert not service.readiness.ready, "first pass off: 503 until the full calibration"
    backend.release.set()
    await starting
    assert service.calibrated.stage == "full"


class FailingFullPass(HeldBackend):
    """Once the first pass is in force (``hold``), a calibration read raises ``fault``; the host says
    whether the engine had stopped."""

    def __init__(self, fault: Exception, engine_stopped: bool) -> None:
        super().__init__()
        self.fault = fault
        self.host = SimpleNamespace(stopped_by=lambda exc: engine_stopped)

    async def read(self, question, context):
        if self.hold and context.request_id.startswith("decision-calibration"):
            raise self.fault
        return await super().read(question, context)


async def test_the_engine_stopping_under_the_full_calibration_logs_one_line(
    tmp_path, caplog
):
    service = serving(
        configured(tmp_path), FailingFullPass(EngineDeadError(), engine_stopped=True)
    )
    await start_service(service)
    (line,) = stop_lines(caplog)
    assert line.levelno == logging.INFO
    assert line.message.startswith(
        "decision calibration stopped with the engine during the full calibration"
    )
    assert service.readiness.ready and service.calibrated.stage == "first pass"


async def test_a_fault_in_the_full_calibration_is_still_an_error(tmp_path, caplog):
    service = serving(
        configured(tmp_path),
        FailingFullPass(RuntimeError("a bug"), engine_stopped=False),
    )
    await start_service(service)
    (error,) = [r for r in package_records(caplog) if r.levelno >= logging.ERROR]
    assert error.message == (
        "decision calibration: the full calibration failed; the first pass stays in force"
    )
    assert error.exc_info is not None and "a bug" in caplog.text
    assert service.readiness.ready and service.calibrated.stage == "first pass"


def test_the_line_says_what_was_cut_short_and_how_far(tmp_path):
    adapter = SimpleNamespace(lora_name="sql")
    service = DecisionService(
        configured(tmp_path), HeldBackend(), "sql", adapter=adapter
    )
    readiness = service.readiness
    assert cut_short(service, "cancelled") == (
        "decision startup through LoRA adapter 'sql' cancelled"
    )
    readiness.begin("self-check")
    assert cut_short(service, "cancelled") == (
        "decision self-check through LoRA adapter 'sql' cancelled"
    )
    readiness.begin("calibration")
    readiness.waiting()
    assert cut_short(service, "cancelled") == (
        "decision calibration through LoRA adapter 'sql' cancelled while another "
        "API-server process did it"
    )
    readiness.count(826, "reads")
    readiness.advance(120)
    assert cut_short(service, "stopped with the engine") == (
        "decision calibration through LoRA adapter 'sql' stopped with the engine after 120 "
        "of 826 reads"
    )


def test_what_says_the_engine_is_stopping():
    """What arrives when vllm serve stops under a read: the engine client is errored (its engine
    dead, its output loop ended), EngineDeadError (the engine core killed first, as by Ctrl-C), or the
    renderer's closed thread pool (a draining stop), maybe wrapped by vLLM's EngineGenerateError."""
    running = SimpleNamespace(engine_client=SimpleNamespace(errored=False))
    dead = SimpleNamespace(engine_client=SimpleNamespace(errored=True))

    def stopped(host, exc: BaseException) -> bool:
        return VllmHost.stopped_by(host, exc)

    closed = RuntimeError("cannot schedule new futures after shutdown")
    wrapped = EngineGenerateError()
    wrapped.__cause__ = closed
    assert stopped(running, EngineDeadError())
    assert stopped(running, closed) and stopped(running, wrapped)
    assert stopped(dead, ValueError("anything, once the engine is dead"))
    assert not stopped(running, RuntimeError("a bug"))
    assert not stopped(running, EngineGenerateError())
    looped = ValueError("a cycle")
    looped.__context__ = KeyError()
    looped.__context__.__context__ = looped
    assert not stopped(running, looped)
