"""The prior corrections wired in: startup calibration chooses each type's correction and saves it, the
service answers with it (its own T, the audit naming it, option_logits raw), a request can pick another,
and a correction that can't apply is refused naming the setting."""

from __future__ import annotations

import asyncio
import json
import math
import random
import zlib
from http import HTTPStatus

import pytest
from pydantic import BaseModel

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.calibration import calibrate
from vllm.entrypoints.generate.decisions.calibration.bias import choose_layout
from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    Calibrated,
    Candidate,
    ReadChoice,
    TypeReads,
)
from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    ChoiceQuestion,
    NoulQuestion,
    ScoreQuestion,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.corrections import (
    Asked,
    Corrections,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    NEUTRAL_INPUTS,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Debias, Settings
from vllm.entrypoints.generate.decisions.decide.temperature import (
    Temperature,
    Temperatures,
)

from .fakes import one_read
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

    async def read(self, question, context) -> Reading:
        state = context.state
        self.states.append(state)
        scores = []
        for position, option in enumerate(question.options):
            noise = (
                3 * (zlib.crc32(f"{state}/{option.value}".encode()) % 1000) / 1000 - 1.5
            )
            named = state not in NEUTRAL_INPUTS and state.endswith(
                f"about {option.value}"
            )
            scores.append(LEAN[position] + (1.5 if named else 0.0) + noise)
        return one_read(scores)


QUESTION = {
    "type": "choice",
    "instructions": "Which team?",
    "criteria": {t: None for t in TEAMS},
}


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
        )
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def team_question():
    return CHOICE.compile(ChoiceQuestion.model_validate(QUESTION))


async def test_calibration_chooses_a_correction_saves_it_and_the_service_answers_with_it(
    tmp_path, caplog
):
    source = write_tickets(tmp_path / "q.jsonl")
    backend = LeaningBackend()
    configured = settings(tmp_path, source, prior="auto")
    calibrated = await startup_calibration(backend, configured, MODEL)
    assert calibrated.reads["choice"].layout is None, (
        "a backend with one way of reading has no layouts"
    )
    choice = calibrated.reads["choice"].chosen
    off, kept = choice.candidates["off"], choice.candidates[choice.mode]
    assert (
        choice.mode != "off"
        and kept.accuracy > off.accuracy
        and kept.log_loss < off.log_loss
    )
    # One distinct question: its neutral reads are made once, beside the 150 real ones.
    assert len(backend.states) == 150 + len(NEUTRAL_INPUTS)
    assert (
        f"decision reads (choice): {choice.mode} kept (held-out log loss {off.log_loss:.3f}"
        in caplog.text
    )
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())
    assert (
        record["key"]["prior"] == "auto"
        and record["reads"]["choice"]["by_layout"]["single"]["mode"] == choice.mode
    )
    again = await startup_calibration(backend, configured, MODEL)
    assert again.reads == calibrated.reads and len(backend.states) == 152, (
        "the saved choice is reused"
    )

    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return calibrated

    await service.start(calibrate)
    (answer,) = (
        await service.decide(ask("a new ticket about sales", [team_question()], "r"))
    ).results
    audit = answer.audit.as_json()
    assert (
        audit["prior"]["mode"] == choice.mode and audit["temperature_scope"] == "choice"
    )
    assert answer.fields["choice"] == "sales", (
        "the evidence wins over the lean once the prior is out"
    )
    raw = answer.backend.option_logits
    reading = await backend.read(
        team_question(), ReadContext.about("a new ticket about sales", "again")
    )
    assert list(raw.values()) == reading.scores, (
        "option_logits stay the raw reading, lean and all"
    )
    t = audit["calibration_temperature"]
    adjusted = list(audit["prior"]["adjusted_logits"].values())
    expected = [
        math.exp(a / t) / sum(math.exp(b / t) for b in adjusted) for a in adjusted
    ]
    assert answer.probabilities == pytest.approx(expected)

    (plain,) = (
        await service.decide(
            ask("a new ticket about sales", [team_question()], "r", prior="off")
        )
    ).results
    assert (
        "prior" not in plain.audit.as_json()
        and list(plain.backend.option_logits.values()) == reading.scores
    )
    assert plain.audit.temperature_scope == "choice:off"
    assert plain.audit.calibration_temperature == pytest.approx(
        choice.candidates["off"].temperature
    )


async def test_prior_off_reads_nothing_more_and_applies_no_correction(tmp_path):
    source = write_tickets(tmp_path / "q.jsonl")
    backend = LeaningBackend()
    calibrated = await startup_calibration(
        backend, settings(tmp_path, source, prior="off"), MODEL
    )
    assert (
        calibrated.reads["choice"].chosen.mode == "off" and len(backend.states) == 150
    )


async def test_a_mode_set_by_the_operator_is_taken_whatever_the_figures(
    tmp_path, caplog
):
    source = write_tickets(tmp_path / "q.jsonl")
    calibrated = await startup_calibration(
        LeaningBackend(), settings(tmp_path, source, prior="fitted"), MODEL
    )
    choice = calibrated.reads["choice"].chosen
    assert (
        choice.mode == "fitted"
        and choice.forced
        and set(choice.candidates) == {"off", "fitted"}
    )
    assert "decision reads (choice): fitted as set;" in caplog.text


def figures(temperature, bias=None, log_loss=0.5, accuracy=0.7):
    return Candidate(
        log_loss=log_loss, accuracy=accuracy, temperature=temperature, bias=bias
    )


CHOSEN = ReadChoice(
    mode="content-free",
    candidates={
        "off": figures(1.5),
        "content-free": figures(0.8),
        "fitted": figures(0.9, [0.0, -1.0, -2.0]),
    },
)
WORDS = ReadChoice(
    mode="off", candidates={"off": figures(1.2), "fitted": figures(1.1, [0.0, 0.5])}
)
READS = {
    "choice": TypeReads(layout=None, by_layout={"single": CHOSEN}),
    "noul": TypeReads(layout="words", by_layout={"letters": CHOSEN, "words": WORDS}),
}
TEMPERATURES = Temperatures(
    Temperature(2.0, "calibrated", "server"),
    {"choice": Temperature(0.7, "calibrated", "choice")},
)
AS_SET = Asked(Debias("rotate", 1))


QUESTIONS = {
    "choice": CHOICE.compile(ChoiceQuestion.model_validate(QUESTION)),
    "noul": NOUL.compile(NoulQuestion(instructions="Is it urgent?")),
    "score": SCORE.compile(
        ScoreQuestion(instructions="How angry?", criteria=["calm", "angry"])
    ),
}


CALIBRATED = Calibrated(TEMPERATURES, reads=READS)


def corrections(setting="auto"):
    return Corrections(setting, 8)


def test_auto_is_calibrations_choice_and_each_mode_gets_its_own_temperature():
    how = CALIBRATED.resolve(QUESTIONS["choice"], AS_SET, corrections())
    assert (how.correction.mode, how.correction.bias, how.layout) == (
        "content-free",
        None,
        None,
    )
    assert how.temperature == Temperature(0.7, "calibrated", "choice")
    how = CALIBRATED.resolve(
        QUESTIONS["choice"], Asked(AS_SET.debias, "fitted"), corrections()
    )
    assert how.correction.bias == [0.0, -1.0, -2.0] and how.temperature == Temperature(
        0.9, "calibrated", "choice:fitted"
    )
    how = CALIBRATED.resolve(
        QUESTIONS["choice"], Asked(AS_SET.debias, "fitted"), corrections(), 3.0
    )
    assert how.temperature == Temperature(3.0, "request", "request"), (
        "a request's T still wins"
    )
    # A type calibration chose nothing for: no correction, the server-wide T.
    how = CALIBRATED.resolve(QUESTIONS["score"], AS_SET, corrections())
    assert (
        how.correction.mode == "off"
        and how.temperature == TEMPERATURES.server
        and how.layout is None
    )
    assert (
        CALIBRATED.resolve(
            QUESTIONS["score"], AS_SET, corrections("content-free")
        ).correction.mode
        == "content-free"
    )
    # Another backend than the one calibrated: none of calibration's choices.
    assert (
        CALIBRATED.resolve(
            QUESTIONS["choice"], AS_SET, corrections(), measured=False
        ).correction.mode
        == "off"
    )


def test_a_type_is_read_in_the_layout_calibration_kept_unless_the_request_names_one():
    how = CALIBRATED.resolve(QUESTIONS["noul"], AS_SET, corrections())
    assert (how.layout, how.correction.mode, how.temperature.scope) == (
        "words",
        "off",
        "server",
    )
    # The request's own layout: the backend's options are left as the request has them, with that layout's
    # choice (content-free in letters) and its T.
    how = CALIBRATED.resolve(
        QUESTIONS["noul"], Asked(AS_SET.debias, None, "letters"), corrections()
    )
    assert (how.layout, how.correction.mode) == (None, "content-free")
    assert how.temperature == Temperature(
        0.8, "calibrated", "noul:letters:content-free"
    )
    how = CALIBRATED.resolve(
        QUESTIONS["noul"], Asked(AS_SET.debias, "fitted"), corrections()
    )
    assert (
        how.correction.bias == [0.0, 0.5]
        and how.temperature.scope == "noul:words:fitted"
    )


def test_a_fitted_mode_without_a_fitted_bias_is_refused_naming_the_setting():
    with pytest.raises(
        DecisionError,
        match=r"^extra\.prior='fitted': no position bias was fitted for score",
    ):
        CALIBRATED.resolve(
            QUESTIONS["score"], Asked(AS_SET.debias, "fitted"), corrections()
        )
    with pytest.raises(
        DecisionError, match=r"^VLLM_TYPED_DECISIONS_PRIOR='content-free\+fitted'"
    ):
        CALIBRATED.resolve(
            QUESTIONS["score"], AS_SET, corrections("content-free+fitted")
        )


def measured(losses, accuracy):
    """A layout's read without a correction, with its held-out loss on each of 100 questions."""
    candidate = Candidate(
        log_loss=sum(losses) / len(losses), accuracy=accuracy, temperature=1.0
    )
    candidate._losses = {f"q{i}": loss for i, loss in enumerate(losses)}
    return ReadChoice(
        mode="off",
        candidates={"off": candidate},
        groups={f"q{i}": f"g{i // 2}" for i in range(100)},
    )


def test_a_layout_is_kept_only_where_it_clearly_beats_the_first_without_a_correction():
    letters = measured([0.69] * 100, 0.5)
    better = measured([0.60 + (0.05 if i % 2 else -0.05) for i in range(100)], 0.6)
    rng = random.Random(0)
    # a little lower, by chance
    noise = measured([0.69 + rng.gauss(-0.005, 0.2) for _ in range(100)], 0.5)
    assert noise.kept.log_loss < letters.kept.log_loss
    assert choose_layout({"letters": letters, "words": better}).layout == "words"
    assert choose_layout({"letters": letters, "words": noise}).layout == "letters", (
        "a gain within the noise"
    )
    assert (
        choose_layout({"letters": letters, "words": measured([0.60] * 100, 0.4)}).layout
        == "letters"
    )
    assert choose_layout({"letters": better, "words": letters}).layout == "letters"


async def test_a_refused_correction_is_that_questions_failure():
    service = DecisionService(Settings.from_env({}), LeaningBackend(), "served")
    await service.start(None)
    noul = NOUL.compile(NoulQuestion(instructions="Is it urgent?"))
    decision = await service.decide(
        ask("ticket about sales", [team_question(), noul], "r", prior="fitted")
    )
    assert [r.error.status for r in decision.results] == [HTTPStatus.BAD_REQUEST] * 2


class LayoutOptions(BaseModel):
    labels: str = "letters"


class TwoLayoutBackend(LeaningBackend):
    """Letters lean by position; words don't, and follow the evidence more."""

    layout_option = "labels"
    layouts = ("letters", "words")
    options_model = LayoutOptions

    def __init__(self, options: LayoutOptions | None = None) -> None:
        super().__init__()
        self.options = options or LayoutOptions()
        self.layouts_read: list[str] = []

    async def read(self, question, context) -> Reading:
        state, options = context.state, context.options
        labels = (options or self.options).labels
        self.layouts_read.append(labels)
        reading = await super().read(question, context)
        if labels == "words":
            named = [
                state.endswith(f"about {o.value}") and state not in NEUTRAL_INPUTS
                for o in question.options
            ]
            reading.scores = [
                s - LEAN[i] + (0.5 if named[i] else 0.0)
                for i, s in enumerate(reading.scores)
            ]
        return reading


async def test_calibration_reads_each_layout_and_the_service_reads_in_the_one_kept(
    tmp_path, caplog
):
    source = write_tickets(tmp_path / "q.jsonl")
    backend = TwoLayoutBackend()
    configured = settings(tmp_path, source, prior="auto")
    calibrated = await startup_calibration(backend, configured, MODEL)
    reads = calibrated.reads["choice"]
    assert reads.layout == "words" and set(reads.by_layout) == {"letters", "words"}
    assert (
        backend.layouts_read.count("letters")
        == backend.layouts_read.count("words")
        == 150 + len(NEUTRAL_INPUTS)
    )
    assert (
        "decision reads (choice): words labels kept (held-out log loss" in caplog.text
    )
    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return calibrated

    await service.start(calibrate)
    backend.layouts_read.clear()
    await service.decide(
        ask("a new ticket about sales", [team_question()], "r", prior="off")
    )
    await service.decide(
        ask(
            "a new ticket about sales",
            [team_question()],
            "r",
            backend_options={"labels": "letters"},
        )
    )
    assert backend.layouts_read == ["words", "letters"], (
        "the layout kept, unless the request names one"
    )
    # An operator's layout at startup: nothing to compare.
    assert TwoLayoutBackend(LayoutOptions(labels="words")).compared_layouts() == ()


class TwoDesksBackend(LeaningBackend):
    """The ticket question leans to the first position; the desk question, worded otherwise, to the last."""

    async def read(self, question, context) -> Reading:
        reading = await super().read(question, context)
        if question.instructions.startswith("Which desk"):
            reading.scores = [
                s - LEAN[i] + LEAN[::-1][i] for i, s in enumerate(reading.scores)
            ]
        return reading


async def test_a_question_labelled_many_times_gets_a_bias_of_its_own(tmp_path, caplog):
    desk = {**QUESTION, "instructions": "Which desk should take it?"}
    lines = [
        json.dumps(
            {
                "state": f"ticket {i} about {TEAMS[i % 3]}",
                "question": QUESTION if i % 2 else desk,
                "expected": TEAMS[i % 3],
                "group": f"g{i % 60}",
                "id": f"q{i}",
            }
        )
        for i in range(240)
    ]
    source = tmp_path / "q.jsonl"
    source.write_text("\n".join(lines) + "\n")
    backend = TwoDesksBackend()
    configured = settings(tmp_path, source, prior="fitted")
    calibrated = await startup_calibration(backend, configured, MODEL)
    reads = calibrated.reads["choice"]
    own = {json.loads(key)[1]: choice for key, choice in reads.questions.items()}
    assert set(own) == {"Which team?", "Which desk should take it?"}
    # Each question's bias undoes its own lean: position 0 down for the team, position 2 down for the desk.
    team, desk_bias = (
        own["Which team?"].kept.bias,
        own["Which desk should take it?"].kept.bias,
    )
    assert team[2] > team[1] > 0 and desk_bias[2] < desk_bias[1] < 0
    assert (
        "decision reads (choice, 'Which desk should take it?'): fitted as set"
        in caplog.text
    )

    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return calibrated

    await service.start(calibrate)
    desk_question = CHOICE.compile(ChoiceQuestion.model_validate(desk))
    (answer,) = (
        await service.decide(ask("a new ticket about sales", [desk_question], "r"))
    ).results
    audit = answer.audit.as_json()
    assert audit["temperature_scope"] == "choice:question:fitted"
    assert audit["prior"]["bias"] == dict(
        zip(['"billing"', '"sales"', '"technical"'], desk_bias, strict=True)
    )


class SlowLayoutBackend(TwoLayoutBackend):
    """Reads finish out of order (each waits a few event-loop turns set by its state), and the real reads'
    (state, layout) are recorded in the order they start."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[str, str]] = []

    async def read(self, question, context) -> Reading:
        if context.state not in NEUTRAL_INPUTS:
            self.started.append(
                (context.state, (context.options or self.options).labels)
            )
        for _ in range(zlib.crc32(context.state.encode()) % 5):
            await asyncio.sleep(0)
        return await super().read(question, context)


async def test_a_questions_layouts_are_read_in_turn_and_the_order_of_reads_changes_nothing(
    tmp_path, monkeypatch
):
    source = write_tickets(tmp_path / "q.jsonl")
    wide, narrow = SlowLayoutBackend(), SlowLayoutBackend()
    first = await startup_calibration(
        wide, settings(tmp_path / "a", source, prior="auto"), MODEL
    )
    # Each question's words read starts after its letters read (so it can find their shared prefix cached).
    for state in {state for state, _ in wide.started}:
        assert [layout for s, layout in wide.started if s == state] == [
            "letters",
            "words",
        ]
    monkeypatch.setattr(calibrate, "CONCURRENCY", 1)
    second = await startup_calibration(
        narrow, settings(tmp_path / "b", source, prior="auto"), MODEL
    )
    states = [f"ticket {i} about {TEAMS[i % 3]}" for i in range(150)]
    assert narrow.started == [
        (state, layout) for state in states for layout in ("letters", "words")
    ]
    assert wide.started != narrow.started, "the reads ran in another order"
    assert first.temperatures == second.temperatures
    assert {k: v.model_dump() for k, v in first.reads.items()} == {
        k: v.model_dump() for k, v in second.reads.items()
    }
