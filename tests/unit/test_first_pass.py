"""Calibration's first pass: decisions answer on it while the full calibration reads on, the full one
reuses its reads and replaces it in one swap, each answer's audit says which it was calibrated on, and
only the full one is saved (a restart loads it with no first pass)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import Calibrated
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    NEUTRAL_INPUTS,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings

from .test_calibration_startup import MODEL
from .test_prior_calibration import TwoLayoutBackend, team_question, write_tickets


class HeldBackend(TwoLayoutBackend):
    """Records each calibration read (state, layout); once ``hold`` is set, calibration reads wait for
    ``release``, and so does a request read about ``HELD``."""

    HELD = "a held ticket about sales"

    def __init__(self) -> None:
        super().__init__()
        self.calibration_reads: list[tuple[str, str]] = []
        self.hold = False
        self.release = asyncio.Event()
        self.release_request = asyncio.Event()
        self.request_waiting = asyncio.Event()

    async def read(self, question, context):
        labels = (context.options or self.options).labels
        if context.request_id.startswith("decision-calibration"):
            self.calibration_reads.append((context.state, labels))
            if self.hold:
                await self.release.wait()
        elif context.state == self.HELD:
            self.request_waiting.set()
            await self.release_request.wait()
        return await super().read(question, context)


def configured(tmp_path, first_pass="on"):
    tmp_path.mkdir(exist_ok=True)
    return Settings.from_env(
        {
            "VLLM_TYPED_DECISIONS_CALIBRATION": str(
                # 200 questions: a first pass reads one in two (calibration_reads.first_pass_stride)
                write_tickets(tmp_path / "q.jsonl", 200)
            ),
            "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
            "VLLM_TYPED_DECISIONS_FIRST_PASS": first_pass,
            # one question asked many times: examples would read it all again (test_examples.py)
            "VLLM_TYPED_DECISIONS_EXAMPLES": "0",
        }
    )


async def audit_of(service, state="a new ticket about sales"):
    (answer,) = (await service.decide(ask(state, [team_question()], "r"))).results
    return answer.audit


async def until(condition):
    while not condition():
        await asyncio.sleep(0)


async def test_answers_on_the_first_pass_then_the_full_calibration_in_one_swap(
    tmp_path, caplog
):
    settings = configured(tmp_path)
    backend = HeldBackend()
    service = DecisionService(settings, backend, "served")
    firsts: list[Calibrated] = []
    counted = []

    def first_pass(calibrated: Calibrated) -> None:
        progress = service.readiness.progress
        assert progress is not None
        counted.append((progress.done, progress.total, progress.unit))
        firsts.append(calibrated)
        backend.hold = True
        service.use_first_pass(calibrated)

    async def calibrate():
        return await startup_calibration(
            backend, settings, MODEL, service.readiness, first_pass
        )

    starting = asyncio.create_task(service.start(calibrate))
    await until(lambda: service.readiness.ready)
    # The 503 counted the first pass's reads: every other question, in the first layout only, no
    # content-free reads.
    assert counted == [(100, 100, "first-pass reads")]
    assert sorted(backend.calibration_reads) == sorted(
        (f"ticket {i} about {['billing', 'sales', 'technical'][i % 3]}", "letters")
        for i in range(0, 200, 2)
    )
    assert not list((tmp_path / "saved").glob("calibration-*.json")), (
        "a first pass is not saved"
    )
    (first,) = firsts
    assert (first.stage, first.question_reads) == ("first pass", 100)
    assert set(first.reads["choice"].by_layout) == {"letters"}
    audit = await audit_of(service)
    assert (audit.calibration_stage, audit.calibration_reads) == ("first pass", 100)
    assert audit.calibration_temperature == first.temperatures.for_type("choice").value
    assert audit.as_json(basic=True)["calibration_stage"] == "first pass"
    assert "decision first-pass calibration: T=" in caplog.text
    assert "decision first-pass reads (choice): " in caplog.text

    # A request that began on the first pass finishes on it, though the swap comes meanwhile.
    held = asyncio.create_task(audit_of(service, HeldBackend.HELD))
    await backend.request_waiting.wait()
    backend.release.set()
    await starting
    backend.release_request.set()
    assert (await held).calibration_stage == "first pass"

    audit = await audit_of(service)
    assert (audit.calibration_stage, audit.calibration_reads) == ("full", 400)
    assert "the full calibration replaces the first pass" in caplog.text
    real = [r for r in backend.calibration_reads if r[0] not in NEUTRAL_INPUTS]
    assert len(real) == len(set(real)) == 400, "no question read twice"
    assert sorted(r for r in backend.calibration_reads if r[0] in NEUTRAL_INPUTS) == [
        (text, layout)
        for text in sorted(NEUTRAL_INPUTS)
        for layout in ("letters", "words")
    ]
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert record["question_reads"] == 400
    assert set(record["reads"]["choice"]["by_layout"]) == {"letters", "words"}

    # The same fits as a calibration with no first pass: reusing its reads changes nothing.
    plain = await startup_calibration(
        TwoLayoutBackend(), configured(tmp_path / "plain", first_pass="off"), MODEL
    )
    assert service.calibrated.temperatures == plain.temperatures
    assert {k: v.model_dump() for k, v in service.calibrated.reads.items()} == {
        k: v.model_dump() for k, v in plain.reads.items()
    }


async def test_no_first_pass_where_a_saved_result_or_the_setting_says_so(tmp_path):
    settings = configured(tmp_path)
    called: list[Calibrated] = []
    full = await startup_calibration(
        TwoLayoutBackend(), settings, MODEL, first_pass=called.append
    )
    assert [c.stage for c in called] == ["first pass"]
    loaded = await startup_calibration(
        TwoLayoutBackend(), settings, MODEL, first_pass=called.append
    )
    assert len(called) == 1, "a saved full calibration is loaded: no first pass"
    assert (loaded.stage, loaded.question_reads) == ("full", 400)
    assert loaded.temperatures == full.temperatures

    off = configured(tmp_path / "off", first_pass="off")
    backend = TwoLayoutBackend()
    await startup_calibration(backend, off, MODEL, first_pass=called.append)
    assert len(called) == 1 and len(backend.layouts_read) == 400 + 2 * len(
        NEUTRAL_INPUTS
    )


async def test_an_uncalibrated_answer_names_no_stage(tmp_path):
    settings = configured(tmp_path)
    service = DecisionService(settings, TwoLayoutBackend(), "served")
    await service.start()
    audit = await audit_of(service)
    assert (audit.calibration_stage, audit.calibration_reads) == (None, None)
    assert audit.as_json()["calibration_stage"] is None


class BlindOnTheFirstPass(TwoLayoutBackend):
    """Confident and right on the odd tickets; on the even ones (those a first pass reads) just as
    confident in an option chosen by the ticket's number, right one time in three: on the first
    pass alone the scores say nothing, on the whole set they do."""

    async def read(self, question, context):
        reading = await super().read(question, context)
        words = context.state.split()
        if context.state.startswith("ticket ") and int(words[1]) % 2 == 0:
            pick = int(words[1]) // 2 % 3
            reading.scores = [6.0 if i == pick else 0.0 for i in range(3)]
        elif context.state.startswith("ticket "):
            reading.scores = [
                6.0 if context.state.endswith(f"about {o.value}") else 0.0
                for o in question.options
            ]
        return reading


async def test_a_first_pass_at_the_top_of_the_range_answers_near_uniform(
    tmp_path, caplog
):
    settings = configured(tmp_path)
    firsts: list[Calibrated] = []
    full = await startup_calibration(
        BlindOnTheFirstPass(), settings, MODEL, first_pass=firsts.append
    )
    (first,) = firsts
    assert first.stage == "first pass"
    assert first.temperatures.server.value == pytest.approx(20.0, rel=1e-3)
    assert "is at the top of [0.05, 20]" in caplog.text
    assert "answers are near uniform until the full calibration" in caplog.text
    # The full calibration, where the scores carry signal, is not at the edge and replaces it.
    assert full.stage == "full" and full.temperatures.server.value < 10.0
    assert "decision calibration failed" not in caplog.text


class CountsInFlight(TwoLayoutBackend):
    """Records, as each read of a labelled input starts, how many such reads are in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.seen: list[int] = []

    async def read(self, question, context):
        if (
            context.state in NEUTRAL_INPUTS
        ):  # a content-free read, part of its question's
            return await super().read(question, context)
        self.in_flight += 1
        self.seen.append(self.in_flight)
        try:
            await asyncio.sleep(0)
            return await super().read(question, context)
        finally:
            self.in_flight -= 1


async def test_once_decisions_answer_the_full_calibration_reads_one_question_at_a_time(
    tmp_path,
):
    """The engine prefills every read that waits in one step, a request's among them: eight of the
    full calibration's in flight kept a 1.5B model's answers 36-41 s late on 2 AVX2 cores, one 6-8 s."""
    settings = configured(tmp_path)
    backend = CountsInFlight()
    first_pass_reads: list[int] = []

    def first_pass(calibrated: Calibrated) -> None:
        first_pass_reads.extend(backend.seen)
        backend.seen.clear()

    await startup_calibration(backend, settings, MODEL, first_pass=first_pass)
    assert max(first_pass_reads) == 8, "nothing is answered yet: 8 at once"
    assert len(backend.seen) == 300 and max(backend.seen) == 1
    # A restart answers on the saved first pass at once, so its full calibration reads one at a time.
    (full,) = (tmp_path / "saved").glob("calibration-*.json")
    full.unlink()
    restarted = CountsInFlight()
    called: list[Calibrated] = []
    await startup_calibration(restarted, settings, MODEL, first_pass=called.append)
    assert [c.stage for c in called] == ["first pass"]
    assert len(restarted.seen) == 400 and max(restarted.seen) == 1
