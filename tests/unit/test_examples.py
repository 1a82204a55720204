"""In-context examples (issue 40, item 3): which labelled inputs are shown, the keep rule against the
answers without them, and the whole path on a scripted backend: calibration reads each label with
examples from the other folds only, keeps them for a question they help, saves them, and the service
asks that question with them (and nothing else with them)."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from tests.unit.asking import ask
from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.calibration.examples import (
    MAX_EXAMPLE_CHARS,
    measure_examples,
    pick_examples,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    ShownExample,
    question_key,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    Labelled,
    fold_of_groups,
)
from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.prior import fingerprint
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService

from .fakes import one_read
from .test_calibration_startup import MODEL, settings
from .test_operator_labels import MOOD, PRIORITY, TEAM, compiled


def test_examples_take_each_answer_in_turn_and_leave_long_inputs_out():
    states = ["a1", "a2", "b1", "x" * (MAX_EXAMPLE_CHARS + 1), "a3", "c1"]
    answers = ["a", "a", "b", "c", "a", "c"]
    assert pick_examples(states, answers, 4) == [0, 2, 5, 1]
    assert pick_examples(states, answers, 2) == [0, 2]
    assert pick_examples(states, answers, 0) == []
    assert pick_examples(states[:2], answers[:2], 4) == [0, 1]


def synthetic(seed: int, informative: bool, n: int = 40):
    """Two-option scores that carry the answer (``informative``) or none of it."""
    rng = np.random.default_rng(seed)
    correct = [i % 2 for i in range(n)]
    signal = 2.0 if informative else 0.0
    scores = [
        [signal * (c == 0) + rng.normal(), signal * (c == 1) + rng.normal()]
        for c in correct
    ]
    return scores, correct, [f"g{i}" for i in range(n)]


@pytest.mark.parametrize("seed", range(3))
def test_examples_that_help_are_kept_and_ones_that_hurt_are_not(seed):
    shown_list = [ShownExample(state="s", answer="a")]
    blind, correct, groups = synthetic(seed, informative=False)
    sharp, _, _ = synthetic(seed + 10, informative=True)
    blind_labels, sharp_labels = (
        Labelled(blind, correct, groups),
        Labelled(sharp, correct, groups),
    )
    helped = measure_examples(shown_list, blind_labels, sharp, 1.0)
    assert helped.kept and helped.log_loss < helped.type_log_loss
    hurt = measure_examples(shown_list, sharp_labels, blind, 1.0)
    assert not hurt.kept and hurt.log_loss > hurt.type_log_loss
    same = measure_examples(shown_list, sharp_labels, sharp, 1.0)
    assert not same.kept, "no gain without a difference"
    assert helped.abstention is None, "no precision asked"
    # A precision asked of the question: its threshold is fitted on the reads with examples, so
    # the sharp reads clear it where the blind ones can't.
    asked = measure_examples(shown_list, blind_labels, sharp, 1.0, 0.8)
    refused = measure_examples(shown_list, sharp_labels, blind, 1.0, 0.8)
    assert asked.abstention is not None and asked.abstention.scope == "question"
    assert asked.abstention.threshold is not None
    assert refused.abstention is not None
    assert refused.abstention.coverage < asked.abstention.coverage


def test_the_content_free_cache_tells_reads_with_examples_apart():
    plain = fingerprint("logit", "v", None, "choice", "Which?", ["a", "b"])
    with_one = fingerprint(
        "logit", "v", None, "choice", "Which?", ["a", "b"], [("doc", '"a"')]
    )
    assert plain != with_one


class ReadsBetterWithExamples(DecisionBackend):
    """Scores that name the input's option; on the priority question faintly, unless examples are
    shown (the other questions read as well with examples as without). Records every read's
    examples."""

    name = "reads-better-with-examples"
    render_version = "reads-better-with-examples-1"

    def __init__(self) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]
        self.seen: list[tuple[str, str, tuple[str, ...]]] = []

    async def read(self, question, context: ReadContext) -> Reading:
        self.seen.append(
            (
                question.instructions,
                context.state,
                tuple(e.state for e in context.examples),
            )
        )
        signal = 1.5
        if question.instructions == "Which priority?":
            signal = 2.5 if context.examples else 0.2
        scores = []
        for option in question.options:
            noise = 2 * (zlib.crc32(f"{context.state}/{option.value}".encode()) % 1000)
            named = context.state.endswith(f"about {option.value}")
            scores.append(signal * named + noise / 1000 - 1)
        return one_read(scores)


def write_labels(path):
    """90 team labels and 30 priority labels (balanced), 5 mood labels (too few to measure)."""
    rows = [
        (f"ticket {i} about {('billing', 'sales', 'technical')[i % 3]}", TEAM, i)
        for i in range(90)
    ]
    rows += [
        (f"request {i} about {('low', 'medium', 'high')[i % 3]}", PRIORITY, i)
        for i in range(30)
    ]
    rows += [
        (f"note {i} about {('calm', 'cross', 'glad')[i % 3]}", MOOD, i)
        for i in range(5)
    ]
    path.write_text(
        "\n".join(
            json.dumps(
                {
                    "state": state,
                    "question": question,
                    "expected": state.rsplit(" ", 1)[1],
                    "group": f"{question['instructions']}{i}",
                }
            )
            for state, question, i in rows
        )
        + "\n"
    )
    return path


async def test_calibration_keeps_examples_where_they_help_and_the_service_asks_with_them(
    tmp_path, caplog
):
    configured = settings(tmp_path, write_labels(tmp_path / "labels.jsonl"), examples=4)
    backend = ReadsBetterWithExamples()
    calibrated = await startup_calibration(backend, configured, MODEL)
    priority, team, mood = compiled(PRIORITY), compiled(TEAM), compiled(MOOD)

    # Every labelled input read with examples saw only inputs of other folds, never its own.
    states = {
        f"request {i} about {('low', 'medium', 'high')[i % 3]}": f"Which priority?{i}"
        for i in range(30)
    }
    folds = dict(
        zip(
            states,
            fold_of_groups(list(states.values()), FOLDS),
            strict=True,
        )
    )
    calibration_reads = [s for s in backend.seen if s[2] and s[1] in states]
    assert len(calibration_reads) == 30
    for _, state, examples in calibration_reads:
        assert len(examples) == 4 and state not in examples
        assert all(folds[example] != folds[state] for example in examples)

    kept = calibrated.examples
    assert set(kept) == {question_key(priority)}, "kept only where they help"
    shown = kept[question_key(priority)]
    assert shown.labels == 30 and shown.gain[0] > 0 and shown.kept
    assert [e.answer for e in shown.examples] == [
        '"low"',
        '"medium"',
        '"high"',
        '"low"',
    ]
    assert "4 in-context examples kept over 30 labels" in caplog.text
    assert "(choice, 'Which team?'): 4 in-context examples not kept" in caplog.text

    service = DecisionService(configured, backend, "served")

    async def calibrate():
        return calibrated

    await service.start(calibrate)
    backend.seen.clear()
    answers = (
        await service.decide(ask("a new request about high", [priority, team, mood]))
    ).results
    by_question = {instructions: examples for instructions, _, examples in backend.seen}
    assert by_question["Which priority?"] == tuple(e.state for e in shown.examples)
    assert by_question["Which team?"] == by_question["Which mood?"] == ()
    audit = answers[0].audit
    assert audit.temperature_scope == "choice:examples"
    assert audit.examples is not None and audit.examples.examples == 4
    assert audit.as_json()["examples"]["labels"] == 30
    assert answers[0].fields["choice"] == "high"
    assert answers[1].audit.examples is None and answers[2].audit.examples is None

    # A request's own T is not what the examples' map was fitted for: read without them.
    backend.seen.clear()
    (asked_t,) = (
        await service.decide(
            ask("a new request about high", [priority], temperature=2.0)
        )
    ).results
    assert backend.seen[0][2] == () and asked_t.audit.examples is None

    # Saved with the calibration, measured ones too, and loaded with it.
    (saved,) = (tmp_path / "saved").glob("calibration-*.json")
    record = json.loads(saved.read_text())["question_examples"]
    assert set(record) == {question_key(priority), question_key(team)}
    again = await startup_calibration(backend, configured, MODEL)
    assert again.examples == calibrated.examples


class FailsWithExamples(ReadsBetterWithExamples):
    """A backend whose reads with examples fail in a way no refusal covers."""

    async def read(self, question, context: ReadContext) -> Reading:
        if context.examples:
            raise RuntimeError("the engine fell over")
        return await super().read(question, context)


async def test_a_fault_while_measuring_examples_costs_the_examples_not_the_calibration(
    tmp_path, caplog
):
    configured = settings(tmp_path, write_labels(tmp_path / "labels.jsonl"), examples=4)
    calibrated = await startup_calibration(FailsWithExamples(), configured, MODEL)
    assert calibrated.stage == "full" and calibrated.examples == {}
    assert calibrated.temperatures.server.source == "calibrated"
    assert "in-context examples not measured" in caplog.text
