"""The prior corrections wired in: startup calibration chooses each type's correction and saves it, the
service answers with it (its own T, the audit naming it, option_logits raw), a request can pick another,
and a correction that can't apply is refused naming the setting."""

from __future__ import annotations

import json
import math
import zlib
from http import HTTPStatus

import pytest

from vllm.entrypoints.generate.decisions.backends.base import DecisionBackend, Reading
from vllm.entrypoints.generate.decisions.calibration.bias import Candidate, ReadChoice
from vllm.entrypoints.generate.decisions.calibration.run import startup_calibration
from vllm.entrypoints.generate.decisions.calibration.temperature import Temperature, Temperatures
from vllm.entrypoints.generate.decisions.corrections import Corrections
from vllm.entrypoints.generate.decisions.errors import DecisionError
from vllm.entrypoints.generate.decisions.prior import NEUTRAL_INPUTS
from vllm.entrypoints.generate.decisions.questions import CHOICE, NOUL, ChoiceQuestion, NoulQuestion
from vllm.entrypoints.generate.decisions.service import DecisionService
from vllm.entrypoints.generate.decisions.settings import Settings

from .test_calibration_startup import MODEL, settings

TEAMS = ("billing", "sales", "technical")
# The model's lean by position (the canonical order lists billing, sales, technical), whatever the input.
LEAN = [2.0, 0.6, 0.0]


class LeaningBackend(DecisionBackend):
    """A choice read: each position's lean, plus 1.5 for the team the input names and some noise;
    a neutral input names no team."""

    name = "leaning"
    render_version = "leaning-1"

    def __init__(self) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]
        self.states: list[str] = []

    async def read(self, state, question, request_id, options=None) -> Reading:
        self.states.append(state)
        scores = []
        for position, option in enumerate(question.options):
            noise = 3 * (zlib.crc32(f"{state}/{option.value}".encode()) % 1000) / 1000 - 1.5
            named = state not in NEUTRAL_INPUTS and state.endswith(f"about {option.value}")
            scores.append(LEAN[position] + (1.5 if named else 0.0) + noise)
        return Reading(scores=scores, forward_passes=1, input_tokens=10, cached_input_tokens=0, readout="direct")


QUESTION = {"type": "choice", "instructions": "Which team?", "criteria": {t: None for t in TEAMS}}


def write_tickets(path, count=150):
    lines = [
        json.dumps(
            {
                "state": f"ticket {i} about {TEAMS[i % 3]}",
                "question": QUESTION,
                "expected": TEAMS[i % 3],
                "group": f"g{i % 50}",
                "id": f"q{i}",
            }
        )  # fmt: skip
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def team_question():
    return CHOICE.compile(ChoiceQuestion.model_validate(QUESTION))


async def test_calibration_chooses_a_correction_saves_it_and_the_service_answers_with_it(tmp_path, caplog):
    source = write_tickets(tmp_path / "q.jsonl")
    backend = LeaningBackend()
    configured = settings(tmp_path, source, prior="auto")
    calibrated = await startup_calibration(backend, configured, MODEL)
    choice = calibrated.reads["choice"]
    off, kept = choice.candidates["off"], choice.candidates[choice.mode]
    assert choice.mode != "off" and kept.accuracy > off.accuracy and kept.log_loss < off.log_loss
    # One distinct question: its neutral reads are made once, beside the 150 real ones.
    assert len(backend.states) == 150 + len(NEUTRAL_INPUTS)
    assert f"decision reads (choice): {choice.mode} kept (held-out log loss {off.log_loss:.3f}" in caplog.text
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert record["key"]["prior"] == "auto" and record["reads"]["choice"]["mode"] == choice.mode
    again = await startup_calibration(backend, configured, MODEL)
    assert again.reads == calibrated.reads and len(backend.states) == 152, "the saved choice is reused"

    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return calibrated

    await service.start(calibrate)
    (answer,) = (await service.decide("a new ticket about sales", [team_question()], "r")).results
    audit = answer.audit.as_json()
    assert audit["prior"]["mode"] == choice.mode and audit["temperature_scope"] == "choice"
    assert answer.fields["choice"] == "sales", "the evidence wins over the lean once the prior is out"
    raw = answer.backend.option_logits
    reading = await backend.read("a new ticket about sales", team_question(), "again")
    assert list(raw.values()) == reading.scores, "option_logits stay the raw reading, lean and all"
    t = audit["calibration_temperature"]
    adjusted = list(audit["prior"]["adjusted_logits"].values())
    expected = [math.exp(a / t) / sum(math.exp(b / t) for b in adjusted) for a in adjusted]
    assert answer.probabilities == pytest.approx(expected)

    (plain,) = (await service.decide("a new ticket about sales", [team_question()], "r", prior="off")).results
    assert "prior" not in plain.audit.as_json() and list(plain.backend.option_logits.values()) == reading.scores
    assert plain.audit.temperature_scope == "choice:off"
    assert plain.audit.calibration_temperature == pytest.approx(choice.candidates["off"].temperature)


async def test_prior_off_reads_nothing_more_and_chooses_nothing(tmp_path):
    source = write_tickets(tmp_path / "q.jsonl")
    backend = LeaningBackend()
    calibrated = await startup_calibration(backend, settings(tmp_path, source, prior="off"), MODEL)
    assert calibrated.reads == {} and len(backend.states) == 150


async def test_a_mode_set_by_the_operator_is_taken_whatever_the_figures(tmp_path, caplog):
    source = write_tickets(tmp_path / "q.jsonl")
    calibrated = await startup_calibration(LeaningBackend(), settings(tmp_path, source, prior="fitted"), MODEL)
    choice = calibrated.reads["choice"]
    assert choice.mode == "fitted" and choice.forced and set(choice.candidates) == {"off", "fitted"}
    assert "decision reads (choice): fitted as set;" in caplog.text


def figures(temperature, bias=None):
    return Candidate(log_loss=0.5, accuracy=0.7, temperature=temperature, bias=bias)


CHOSEN = ReadChoice(mode="content-free", candidates={"off": figures(1.5), "content-free": figures(0.8),
                                                     "fitted": figures(0.9, [0.0, -1.0, -2.0])})  # fmt: skip
TEMPERATURES = Temperatures(
    Temperature(2.0, "calibrated", "server"), {"choice": Temperature(0.7, "calibrated", "choice")}
)


def test_auto_is_calibrations_choice_and_each_mode_gets_its_own_temperature():
    corrections = Corrections("auto", 8)
    corrections.reads = {"choice": CHOSEN}
    correction, t = corrections.resolve("choice", None, TEMPERATURES, None)
    assert (correction.mode, correction.bias, t) == ("content-free", None, Temperature(0.7, "calibrated", "choice"))
    correction, t = corrections.resolve("choice", "fitted", TEMPERATURES, None)
    assert correction.bias == [0.0, -1.0, -2.0] and t == Temperature(0.9, "calibrated", "choice:fitted")
    correction, t = corrections.resolve("choice", "fitted", TEMPERATURES, 3.0)
    assert t == Temperature(3.0, "request", "request"), "a request's T still wins"
    # A type calibration chose nothing for: no correction, the server-wide T.
    correction, t = corrections.resolve("noul", None, TEMPERATURES, None)
    assert correction.mode == "off" and t == TEMPERATURES.server
    assert Corrections("content-free", 8).mode_for("noul") == "content-free", "a mode set is taken as set"


def test_a_fitted_mode_without_a_fitted_bias_is_refused_naming_the_setting():
    with pytest.raises(DecisionError, match=r"^extra\.prior='fitted': no position bias was fitted for noul"):
        Corrections("auto", 8).resolve("noul", "fitted", TEMPERATURES, None)
    with pytest.raises(DecisionError, match=r"^VLLM_TYPED_DECISIONS_PRIOR='content-free\+fitted'"):
        Corrections("content-free+fitted", 8).resolve("noul", None, TEMPERATURES, None)


async def test_a_refused_correction_is_that_questions_failure():
    service = DecisionService(Settings.from_env({}), LeaningBackend(), "served")
    await service.start(None)
    noul = NOUL.compile(NoulQuestion(instructions="Is it urgent?"))
    decision = await service.decide("ticket about sales", [team_question(), noul], "r", prior="fitted")
    assert [r.error.status for r in decision.results] == [HTTPStatus.BAD_REQUEST] * 2
