"""Abstention thresholds: fitted on a few hundred synthetic held-out labels, they reach the precision
asked for on a large fresh draw from the same model, calibrated or not; a precision out of reach gives
the abstain-always record; groups and the all-right corner are not taken as more evidence than they are.
A precision asked of one question is fitted on its own labels as it is served, and an answer is judged
by the rule fitted for how it was read."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from vllm.entrypoints.generate.decisions.calibration.abstention import (
    abstains,
    fit_abstention,
    question_thresholds,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    Abstention,
    Calibrated,
    QuestionExamples,
    question_key,
)
from vllm.entrypoints.generate.decisions.calibration.maths import Labelled
from vllm.entrypoints.generate.decisions.calibration.question_map import fit_map
from vllm.entrypoints.generate.decisions.decide.questions import CHOICE, ChoiceQuestion
from vllm.entrypoints.generate.decisions.decide.temperature import (
    DEFAULT,
    Temperatures,
)

Model = Callable[[int, np.random.Generator], tuple[np.ndarray, np.ndarray]]
SEEDS = range(8)
FIT = 300
FRESH = 20_000
SLACK = 0.05


def calibrated(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Confidences whose answers are right exactly that often (mean accuracy 0.8, more mass near 1)."""
    confidence = 0.2 + 0.8 * rng.beta(3.0, 1.0, n)
    return confidence, rng.random(n) < confidence


def overconfident(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A model sure of its easy answers (40%, right 96-100% of the time) and overconfident on the
    rest (right 20-90% of the time), which shows each answer's chance of being right as its 10th root:
    right 40% of the time at a shown 0.91. Mean accuracy 0.72."""
    easy = rng.random(n) < 0.4
    truth = np.where(easy, rng.uniform(0.96, 1.0, n), rng.uniform(0.2, 0.9, n))
    return truth**0.1, rng.random(n) < truth


def groups_of_three(n: int) -> list[str]:
    return [f"q{i // 3}" for i in range(n)]


def fresh_precision(record: Abstention, model: Model, seed: int) -> tuple[float, float]:
    """Precision among fresh answers that clear the record's threshold, and their share."""
    confidence, right = model(FRESH, np.random.default_rng(10_000 + seed))
    given = np.array([record.clears(float(c)) for c in confidence])
    assert given.any(), record
    return float(right[given].mean()), float(given.mean())


@pytest.mark.parametrize("asked", [0.8, 0.9])
def test_calibrated_model_reaches_the_precision_on_fresh_answers(asked):
    reached = []
    for seed in SEEDS:
        confidence, right = calibrated(FIT, np.random.default_rng(seed))
        record = fit_abstention(confidence, right, groups_of_three(FIT), asked)
        assert record.threshold is not None, record
        precision, coverage = fresh_precision(record, calibrated, seed)
        assert precision >= asked - SLACK, (seed, record, precision)
        assert coverage > 0.05, (seed, record, coverage)
        # The labels' own figures: the bound cleared the asked precision, below what was observed.
        assert record.precision_reached >= record.precision_bound >= asked
        given = confidence >= record.threshold
        assert record.answered == given.sum()
        assert record.coverage == pytest.approx(given.mean())
        assert record.precision_reached == pytest.approx(right[given].mean())
        reached.append(precision)
    # Conservative, not merely close: most fits reach the asked precision itself.
    assert np.mean(np.array(reached) >= asked) >= 0.75, reached


@pytest.mark.parametrize("asked", [0.8, 0.9])
def test_overconfident_model_reaches_it_because_the_threshold_is_fitted_on_labels(
    asked,
):
    # The model really is overconfident: taking its confidence at its word misses by far.
    confidence, right = overconfident(FRESH, np.random.default_rng(99))
    assert right[confidence >= asked].mean() < asked - 0.05
    for seed in SEEDS:
        confidence, right = overconfident(FIT, np.random.default_rng(seed))
        record = fit_abstention(confidence, right, groups_of_three(FIT), asked)
        assert record.threshold is not None and record.threshold > asked, record
        precision, coverage = fresh_precision(record, overconfident, seed)
        assert precision >= asked - SLACK, (seed, record, precision)
        assert coverage > 0.05, (seed, record, coverage)


def test_a_precision_out_of_reach_abstains_always_and_says_why():
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.5, 1.0, FIT)
    right = rng.random(FIT) < 0.6  # 60% right whatever the confidence
    record = fit_abstention(confidence, right, groups_of_three(FIT), 0.99)
    assert record.abstains_always and record.threshold is None
    assert record.coverage == 0.0 and record.answered == 0
    assert record.precision_reached is None and record.precision_bound is None
    assert record.labels == FIT and record.groups == FIT // 3
    assert record.reason is not None
    assert "no threshold reaches precision 0.99" in record.reason
    assert "every answer abstains" in record.reason
    assert not record.clears(1.0)


def test_too_few_labels_abstain_always():
    record = fit_abstention([0.99] * 10, [True] * 10, [str(i) for i in range(10)], 0.5)
    assert record.abstains_always
    assert record.reason is not None and "too few labelled answers (10 < 20)" in (
        record.reason
    )


def test_a_threshold_needs_enough_answered_labels():
    # The 8 most confident of 40 answers are right, the rest wrong: only thresholds that answer
    # about a dozen or fewer reach 0.5, too few to trust by the default minimum of 20.
    confidence = np.linspace(0.5, 0.9, 40)
    right = np.arange(40) >= 32
    groups = [str(i) for i in range(40)]
    assert fit_abstention(confidence, right, groups, 0.5).abstains_always
    record = fit_abstention(confidence, right, groups, 0.5, min_answered=5)
    assert record.threshold is not None and 8 <= record.answered < 20, record


def test_every_answer_right_on_few_labels_does_not_certify_a_high_precision():
    # 25 of 25 right: the grouped bootstrap's every resample is all right (bound 1.0); the Wilson
    # bound (0.903) is what keeps 0.95 out of reach, and 0.85 within it.
    confidence = np.linspace(0.9, 1.0, 25)
    groups = [str(i) for i in range(25)]
    assert fit_abstention(confidence, [True] * 25, groups, 0.95).abstains_always
    record = fit_abstention(confidence, [True] * 25, groups, 0.85)
    assert record.threshold == pytest.approx(0.9) and record.coverage == 1.0


def test_answers_that_share_a_group_count_as_less_evidence():
    rng = np.random.default_rng(3)
    confidence, right = calibrated(30, rng)
    confidence, right = np.repeat(confidence, 10), np.repeat(right, 10)
    alone = fit_abstention(confidence, right, [str(i) for i in range(300)], 0.8)
    together = fit_abstention(
        confidence, right, [str(i // 10) for i in range(300)], 0.8
    )
    # Each answer its own group: 300 pieces of evidence. Ten copies in one group: 30.
    assert alone.threshold is not None, alone
    assert together.coverage < alone.coverage, (alone, together)


def test_the_threshold_itself_clears():
    confidence, right = calibrated(FIT, np.random.default_rng(1))
    record = fit_abstention(confidence, right, groups_of_three(FIT), 0.8)
    assert record.threshold is not None
    assert record.clears(record.threshold)
    assert not record.clears(np.nextafter(record.threshold, 0.0))


def test_the_record_round_trips_through_json():
    confidence, right = calibrated(FIT, np.random.default_rng(2))
    fitted = fit_abstention(confidence, right, groups_of_three(FIT), 0.8)
    never = fit_abstention(confidence, right, groups_of_three(FIT), 0.999)
    assert fitted.threshold is not None and never.threshold is None
    for record in (fitted, never):
        again = Abstention.model_validate_json(record.model_dump_json())
        assert again == record


def test_the_fit_is_reproducible_for_a_seed():
    confidence, right = calibrated(FIT, np.random.default_rng(4))
    groups = groups_of_three(FIT)
    assert fit_abstention(confidence, right, groups, 0.9, seed=7) == fit_abstention(
        confidence, right, groups, 0.9, seed=7
    )


@pytest.mark.parametrize(
    "confidences, correct, groups, precision",
    [
        ([0.9] * 30, [True] * 30, ["a"] * 30, 1.0),
        ([0.9] * 30, [True] * 30, ["a"] * 30, 0.0),
        ([0.9] * 30, [True] * 29, ["a"] * 30, 0.8),
        ([0.9] * 30, [True] * 30, ["a"] * 29, 0.8),
        ([1.5] * 30, [True] * 30, ["a"] * 30, 0.8),
        ([float("nan")] * 30, [True] * 30, ["a"] * 30, 0.8),
    ],
)
def test_bad_inputs_are_refused(confidences, correct, groups, precision):
    with pytest.raises(ValueError):
        fit_abstention(confidences, correct, groups, precision)


@pytest.mark.parametrize("settings", [{"resamples": 0}, {"min_answered": 0}])
def test_bad_settings_are_refused(settings):
    with pytest.raises(ValueError):
        fit_abstention([0.9] * 30, [True] * 30, ["a"] * 30, 0.8, **settings)


def test_a_saved_record_with_impossible_figures_is_refused():
    good = fit_abstention(
        *calibrated(FIT, np.random.default_rng(5)), groups_of_three(FIT), 0.8
    )
    for field, value in (
        ("precision_asked", 1.0),
        ("threshold", 1.2),
        ("coverage", -0.1),
    ):
        with pytest.raises(ValueError):
            Abstention.model_validate({**good.model_dump(), field: value})


def leaning_question(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One question's scores: the right option gets 2.5 more, and every answer leans 2.5 toward
    option 0, a lean its own map takes out and its type's (scale 1, no bias) keeps."""
    rng = np.random.default_rng(seed)
    correct = rng.integers(0, 3, n)
    scores = rng.normal(0.0, 1.0, (n, 3))
    scores[np.arange(n), correct] += 2.5
    scores[:, 0] += 2.5
    return scores, correct


def test_a_question_threshold_is_fitted_on_its_own_labels_as_served():
    scores, correct = leaning_question(120, 0)
    n = len(correct)
    labelled = Labelled(scores.tolist(), correct.tolist(), [f"g{i}" for i in range(n)])
    columns = (["q"] * n, labelled, [1.0] * n)
    mapped = question_thresholds(*columns, {"q"}, {"q": 0.8})["q"]
    typed = question_thresholds(*columns, set(), {"q": 0.8})["q"]
    assert mapped.scope == typed.scope == "question"
    assert mapped.threshold is not None and mapped.labels == n
    # Read under its own map (the lean out) far more of its answers clear the precision.
    assert mapped.coverage > typed.coverage + 0.2
    # On fresh inputs of that question, served by its map fitted on every label, the answers
    # that clear the threshold reach the precision asked, within 0.05.
    scale, bias = fit_map(scores.tolist(), correct.tolist(), 1.0)
    fresh, truth = leaning_question(FRESH, 1)
    logits = scale * fresh + np.asarray(bias)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    given = probabilities.max(axis=1) >= mapped.threshold
    right = probabilities.argmax(axis=1) == truth
    assert right[given].mean() >= 0.8 - SLACK
    assert given.mean() == pytest.approx(mapped.coverage, abs=0.1)


def test_a_question_without_labels_to_hold_out_abstains_and_says_why():
    scores, correct = leaning_question(30, 2)
    rules = question_thresholds(
        ["q"] * 30,
        Labelled(scores.tolist(), correct.tolist(), ["one thread"] * 30),
        [1.0] * 30,
        {"q"},
        {"q": 0.8, "never labelled": 0.9},
    )
    for rule in rules.values():
        assert rule.abstains_always and "fewer than two groups" in (rule.reason or "")
    assert rules["q"].labels == 30 and rules["never labelled"].labels == 0


def test_an_answer_is_judged_by_the_rule_fitted_for_how_it_was_read():
    question = CHOICE.compile(
        ChoiceQuestion.model_validate(
            {
                "type": "choice",
                "instructions": "Which?",
                "criteria": {"a": None, "b": None},
            }
        )
    )
    other = CHOICE.compile(
        ChoiceQuestion.model_validate(
            {
                "type": "choice",
                "instructions": "Else?",
                "criteria": {"a": None, "b": None},
            }
        )
    )

    def rule(precision: float, scope: str) -> Abstention:
        return abstains(precision, 0, 0, "none").model_copy(update={"scope": scope})

    shown = QuestionExamples(
        examples=[],
        scale=1.0,
        bias=[0.0, 0.0],
        abstention=rule(0.7, "question"),
        labels=10,
        log_loss=0.5,
        accuracy=0.8,
        type_log_loss=0.6,
        type_accuracy=0.7,
        gain=(0.01, 0.2),
    )
    calibrated = Calibrated(
        Temperatures(DEFAULT),
        abstention={"choice": rule(0.9, "type")},
        question_abstention={question_key(question): rule(0.8, "question")},
    )
    assert calibrated.abstention_for(question).precision_asked == 0.8
    assert calibrated.abstention_for(question, shown).precision_asked == 0.7
    assert calibrated.abstention_for(other).precision_asked == 0.9
    assert Calibrated(Temperatures(DEFAULT)).abstention_for(question) is None
