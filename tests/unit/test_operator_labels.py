"""What the operator's labels buy, wired in (issue 40). A question's own map: startup calibration fits
it for a question its file labels often enough, saves it and logs it; the service answers that question
with it (its scale as the temperature, its bias added, the audit naming both), and every other
question, a request with its own T, or another correction keeps the type's reads. Abstention: a
precision asked of a type (VLLM_TYPED_DECISIONS_PRECISION) gets a confidence threshold fitted on held-out
labels, saved, and each answer says whether it clears it."""

from __future__ import annotations

import json
import math
import zlib

import pytest

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import question_key
from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.questions import CHOICE, ChoiceQuestion
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings

from .fakes import one_read
from .test_calibration_startup import MODEL, settings

TEAM = {
    "type": "choice",
    "instructions": "Which team?",
    "criteria": {"billing": None, "sales": None, "technical": None},
}
PRIORITY = {
    "type": "choice",
    "instructions": "Which priority?",
    "criteria": {"low": None, "medium": None, "high": None},
}
MOOD = {
    "type": "choice",
    "instructions": "Which mood?",
    "criteria": {"calm": None, "cross": None, "glad": None},
}


def compiled(question: dict):
    return CHOICE.compile(ChoiceQuestion.model_validate(question))


class LeansOnOneQuestion(DecisionBackend):
    """Each option named by the input gets 1.5 and some noise; on the priority question alone the
    model also leans 3 toward ``low`` whatever the input says: a lean no type-wide fit can take out
    without hurting the other questions, and plain in that question's labels."""

    name = "leans-on-one"
    render_version = "leans-on-one-1"

    def __init__(self) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]

    async def read(self, question, context) -> Reading:
        state = context.state
        scores = []
        for option in question.options:
            noise = 2 * (zlib.crc32(f"{state}/{option.value}".encode()) % 1000) / 1000
            lean = 3.0 if option.value == "low" else 0.0
            named = 1.5 if state.endswith(f"about {option.value}") else 0.0
            scores.append(named + lean + noise - 1)
        return one_read(scores)


def write_labels(path, asked: dict | None = None):
    """120 team labels, 60 priority labels (balanced), 5 mood labels (too few for a map);
    ``asked``: each line of those questions (by instructions) asks that precision."""
    rows = [
        (f"ticket {i} about {t}", TEAM, t, f"t{i}")
        for i in range(120)
        for t in [("billing", "sales", "technical")[i % 3]]
    ]
    rows += [
        (f"request {i} about {p}", PRIORITY, p, f"p{i}")
        for i in range(60)
        for p in [("low", "medium", "high")[i % 3]]
    ]
    rows += [
        (f"note {i} about {m}", MOOD, m, f"m{i}")
        for i in range(5)
        for m in [("calm", "cross", "glad")[i % 3]]
    ]
    precision = {name: {"precision": p} for name, p in (asked or {}).items()}
    path.write_text(
        "\n".join(
            json.dumps(
                {"state": s, "question": q, "expected": e, "group": g, "id": g}
                | precision.get(q["instructions"], {})
            )
            for s, q, e, g in rows
        )
        + "\n"
    )
    return path


async def calibrated_service(tmp_path, asked=None, **env):
    configured = settings(tmp_path, write_labels(tmp_path / "labels.jsonl", asked))
    if env:
        configured = Settings.from_env(
            {
                "VLLM_TYPED_DECISIONS_CALIBRATION": str(tmp_path / "labels.jsonl"),
                "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
                "VLLM_TYPED_DECISIONS_PRIOR": "off",
                **env,
            }
        )
    backend = LeansOnOneQuestion()
    calibrated = await startup_calibration(backend, configured, MODEL)
    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return calibrated

    await service.start(calibrate)
    return service, calibrated, configured, backend


async def test_a_labelled_question_gets_its_own_map_and_answers_with_it(
    tmp_path, caplog
):
    service, calibrated, configured, backend = await calibrated_service(tmp_path)
    priority, mood = compiled(PRIORITY), compiled(MOOD)
    own = calibrated.maps[question_key(priority)]
    assert question_key(mood) not in calibrated.maps, "5 labels: too few for a map"
    assert own.labels == 60 and own.gain[0] > 0 and own.accuracy > own.type_accuracy
    # The map takes the lean out: low's bias is the most negative.
    assert own.bias[0] == min(own.bias) < -1.0
    assert (
        "decision calibration (choice, 'Which priority?'): a map of its own kept from 60"
        in caplog.text
    )

    (answer, other) = (
        await service.decide(ask("a new request about high", [priority, mood]))
    ).results
    audit = answer.audit
    assert audit.temperature_scope == "choice:question"
    assert audit.calibration_temperature == pytest.approx(1.0 / own.scale)
    assert audit.question_map is not None and audit.question_map.labels == 60
    keys = list(answer.backend.option_logits)
    assert audit.question_map.bias == dict(zip(keys, own.bias, strict=True))
    assert audit.as_json()["question_map"]["labels"] == 60
    assert "question_map" not in audit.as_json(basic=True)
    raw = list(answer.backend.option_logits.values())
    logits = [own.scale * s + b for s, b in zip(raw, own.bias, strict=True)]
    expected = [math.exp(v) / sum(math.exp(w) for w in logits) for v in logits]
    assert answer.probabilities == pytest.approx(expected)
    assert answer.fields["choice"] == "high", "the evidence wins once the lean is out"
    assert (
        other.audit.temperature_scope == "choice" and other.audit.question_map is None
    )

    # A request's own T overrides the map, as it does every calibrated T.
    (asked_t,) = (
        await service.decide(
            ask("a new request about high", [priority], temperature=2.0)
        )
    ).results
    assert asked_t.audit.temperature_scope == "request"
    assert asked_t.audit.question_map is None

    # So does another correction than the one the map was fitted on.
    (other_prior,) = (
        await service.decide(
            ask("a new request about high", [priority], prior="content-free")
        )
    ).results
    assert other_prior.audit.question_map is None
    assert other_prior.audit.temperature_scope != "choice:question"

    # Saved with the calibration and loaded with it.
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    assert question_key(priority) in json.loads(saved.read_text())["question_maps"]
    again = await startup_calibration(backend, configured, MODEL)
    assert again.maps == calibrated.maps


async def test_a_precision_asked_of_a_type_gives_each_answer_its_verdict(
    tmp_path, caplog
):
    service, calibrated, configured, backend = await calibrated_service(
        tmp_path, VLLM_TYPED_DECISIONS_PRECISION="choice=0.8"
    )
    rule = calibrated.abstention["choice"]
    assert set(calibrated.abstention) == {"choice"}
    assert (
        rule.precision_asked == 0.8
        and rule.labels == 185
        and rule.threshold is not None
    )
    assert (
        f"decision calibration (choice): precision 0.8 above confidence {rule.threshold:.3f}"
        in caplog.text
    )
    team, mood = compiled(TEAM), compiled(MOOD)
    answers = (
        await service.decide(
            ask("a new ticket about sales", [team, mood, compiled(PRIORITY)])
        )
    ).results
    for answer in answers:
        verdict = answer.abstention
        assert verdict is not None and verdict.precision == 0.8
        assert verdict.threshold == rule.threshold
        assert verdict.abstain == (not rule.clears(max(answer.probabilities)))
    # A T the request sets is not the one the threshold was fitted under: no verdict.
    (own_t,) = (
        await service.decide(ask("a new ticket about sales", [team], temperature=3.0))
    ).results
    assert own_t.abstention is None
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert record["key"]["precision"] == {"choice": 0.8}
    assert record["abstention"]["choice"]["precision_asked"] == 0.8


async def test_a_precision_asked_of_one_question_gets_a_threshold_of_its_own(
    tmp_path, caplog
):
    """The file asks the priority question for 0.8 and the type for 0.9: priority answers are
    judged by a threshold fitted on its own labels, read as it is served (its map takes its lean
    out), the other questions by the type's."""
    service, calibrated, configured, backend = await calibrated_service(
        tmp_path,
        {"Which priority?": 0.8},
        VLLM_TYPED_DECISIONS_PRECISION="choice=0.9",
    )
    priority, team = compiled(PRIORITY), compiled(TEAM)
    (key,) = calibrated.question_abstention
    assert key == question_key(priority) and key in calibrated.maps
    own = calibrated.question_abstention[key]
    assert (own.scope, own.precision_asked, own.labels) == ("question", 0.8, 60)
    assert own.threshold is not None and own.precision_bound >= 0.8
    assert (
        "decision calibration (choice, 'Which priority?'): precision 0.8" in caplog.text
    )
    typed = calibrated.abstention["choice"]
    assert typed.scope == "type" and typed.precision_asked == 0.9

    answers = (
        await service.decide(ask("a new request about high", [priority, team]))
    ).results
    verdict, other = answers[0].abstention, answers[1].abstention
    assert verdict is not None and other is not None
    assert (verdict.scope, verdict.precision, verdict.threshold) == (
        "question",
        0.8,
        own.threshold,
    )
    assert verdict.abstain == (not own.clears(max(answers[0].probabilities)))
    assert (other.scope, other.precision) == ("type", 0.9)
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    assert json.loads(saved.read_text())["question_abstention"][key]["scope"] == (
        "question"
    )
    again = await startup_calibration(backend, configured, MODEL)
    assert again.question_abstention == calibrated.question_abstention
