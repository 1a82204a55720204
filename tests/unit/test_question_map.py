"""A question's own affine map from its labels (calibration/question_map.py), on synthetic labels
only: a known map recovered, the keep rule refusing labels that say nothing beyond the type's map,
the penalty holding a few labels near the type's map, and -inf scores and a single group handled."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vllm.entrypoints.generate.decisions.calibration import question_map
from vllm.entrypoints.generate.decisions.calibration.in_force import QuestionMap
from vllm.entrypoints.generate.decisions.calibration.maths import Labelled
from vllm.entrypoints.generate.decisions.calibration.question_map import (
    choose_question_map,
    fit_map,
    measure_question_map,
)

TRUE_SCALE = 0.4
TRUE_BIAS = [1.0, -0.5, -0.5]
# The type's map the per-question fit is pulled toward: T = 1, no bias.
TYPE_SCALE = 1.0


def labelled(
    count: int,
    scale: float,
    bias: list[float],
    seed: int,
    per_group: int = 1,
    spread: float = 2.0,
) -> tuple[list[list[float]], list[int], list[str]]:
    """``count`` answers of one 3-option question: random log-probability scores (logits of
    spread ``spread``), each answer's correct option drawn from ``softmax(scale * s + bias)``;
    ``per_group`` answers share a group."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, spread, size=(count, len(bias)))
    scores = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    mapped = scale * scores + np.asarray(bias)
    p = np.exp(mapped - mapped.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    correct = [int(rng.choice(len(bias), p=row)) for row in p]
    groups = [f"g{i // per_group}" for i in range(count)]
    return scores.tolist(), correct, groups


def distance(fitted: tuple[float, list[float]], scale: float) -> float:
    """How far a fit lies from the type's map (``scale``, no bias) in the penalty's own metric,
    in which a stronger penalty can only bring the fit closer."""
    relative = fitted[0] / scale - 1.0
    return math.sqrt(
        question_map.SCALE_PENALTY * relative**2
        + question_map.BIAS_PENALTY * float(np.sum(np.square(fitted[1])))
    )


def test_known_map_is_recovered_and_kept():
    scores, correct, groups = labelled(2000, TRUE_SCALE, TRUE_BIAS, seed=1, per_group=4)
    kept = choose_question_map(Labelled(scores, correct, groups), TYPE_SCALE)
    assert kept is not None
    # 2,000 labels: standard errors near 0.02 on the scale and 0.05 on each bias.
    assert kept.scale == pytest.approx(TRUE_SCALE, abs=0.05)
    assert kept.bias == pytest.approx(TRUE_BIAS, abs=0.15)
    assert sum(kept.bias) == pytest.approx(0.0, abs=1e-9)
    assert kept.labels == 2000
    assert kept.gain[0] > 0
    assert kept.log_loss < kept.type_log_loss
    assert kept.accuracy >= kept.type_accuracy
    # Applied to a read: the fitted map's probabilities, not the type's.
    row = scores[0]
    expected = np.exp(kept.scale * np.asarray(row) + kept.bias)
    assert kept.probabilities(row) == pytest.approx(
        (expected / expected.sum()).tolist()
    )


def test_the_fit_is_the_penalised_likelihoods_maximum():
    """At the returned (scale, bias) the penalised log-likelihood's gradient, computed here on its
    own, vanishes: the fit stopped at the optimum, not short of it."""
    type_bias = [0.2, -0.1, -0.1]
    scores, correct, _ = labelled(30, TRUE_SCALE, TRUE_BIAS, seed=11)
    scale, bias = fit_map(scores, correct, 0.8, type_bias)
    s = np.asarray(scores)
    logits = scale * s + np.asarray(bias)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    onehot = np.eye(3)[correct]
    gradient_scale = (
        float(((p - onehot) * s).sum())
        + question_map.SCALE_PENALTY * (scale - 0.8) / 0.8**2
    )
    gradient_bias = (p - onehot).sum(axis=0) + question_map.BIAS_PENALTY * (
        np.asarray(bias) - type_bias
    )
    assert abs(gradient_scale) < 1e-5
    assert np.abs(gradient_bias).max() < 1e-5


def test_labels_from_the_types_own_map_are_refused():
    """Labels that follow the type's map exactly: a question's own map can only add noise, so the
    keep rule should refuse it on (nearly) every seed."""
    type_bias = [0.3, 0.0, -0.3]
    refused = 0
    for seed in range(10):
        scores, correct, groups = labelled(20, 0.8, type_bias, seed=100 + seed)
        labels = Labelled(scores, correct, groups)
        measured = measure_question_map(labels, 0.8, type_bias)
        assert measured.labels == 20
        if choose_question_map(labels, 0.8, type_bias) is None:
            refused += 1
            assert not measured.kept
    assert refused >= 8


def test_few_labels_stay_near_the_types_map_and_the_record_round_trips(monkeypatch):
    """The penalty: a question whose lean the type's map lacks (bias [1, -0.5, -0.5] at the type's
    own scale). On average over draws, 8 labels move its bias part of the way and 200 labels
    nearly all of it; on the same 8 labels, a penalty a thousand times weaker moves it farther."""
    lean = [1.0, -0.5, -0.5]
    moved: dict[int, list[float]] = {8: [], 200: []}
    for seed in range(40):
        scores, correct, _ = labelled(
            200, TYPE_SCALE, lean, seed=200 + seed, spread=1.0
        )
        for count in moved:
            moved[count].append(
                fit_map(scores[:count], correct[:count], TYPE_SCALE)[1][0]
            )
    few, many = float(np.mean(moved[8])), float(np.mean(moved[200]))
    assert 0.3 < few < many - 0.15
    assert many == pytest.approx(1.0, abs=0.15)

    scores, correct, _ = labelled(8, TRUE_SCALE, TRUE_BIAS, seed=5)
    penalised = fit_map(scores, correct, TYPE_SCALE)
    monkeypatch.setattr(question_map, "BIAS_PENALTY", question_map.BIAS_PENALTY / 1000)
    monkeypatch.setattr(
        question_map, "SCALE_PENALTY", question_map.SCALE_PENALTY / 1000
    )
    weak = fit_map(scores, correct, TYPE_SCALE)
    monkeypatch.undo()
    assert distance(penalised, TYPE_SCALE) < distance(weak, TYPE_SCALE)

    scores, correct, groups = labelled(8, TRUE_SCALE, TRUE_BIAS, seed=7)
    record = measure_question_map(Labelled(scores, correct, groups), TYPE_SCALE)
    assert record.labels == 8
    again = QuestionMap.model_validate(json.loads(record.model_dump_json()))
    assert again == record
    assert again.kept == record.kept
    assert again.log_probabilities(scores[0]) == record.log_probabilities(scores[0])


def test_minus_infinity_scores_and_a_single_group():
    """-inf scores enter at SCORE_FLOOR: the fit and the held-out figures stay finite, even for
    an answer whose correct option the reading gave nothing, and an option read as -inf gets the
    least probability under a map that doesn't lean to it. Labels from one group can't be held out:
    choose_question_map says None (the type's reads serve the question) and measure_question_map
    says why; fit_map still fits them."""
    scores, correct, groups = labelled(60, TRUE_SCALE, TRUE_BIAS, seed=3, per_group=3)
    for i in range(0, 60, 5):
        scores[i][2] = -math.inf
    correct[0] = 2  # the correct option read as -inf
    record = measure_question_map(Labelled(scores, correct, groups), TYPE_SCALE)
    figures = [
        record.scale,
        *record.bias,
        record.log_loss,
        record.type_log_loss,
        *record.gain,
    ]
    assert all(math.isfinite(x) for x in figures)
    probabilities = record.probabilities([-0.5, -1.0, -math.inf])
    assert sum(probabilities) == pytest.approx(1.0)
    assert min(probabilities) == probabilities[2] > 0.0
    json.loads(record.model_dump_json())  # no inf or NaN to break the saved record

    one_group = Labelled(scores, correct, ["same"] * 60)
    assert choose_question_map(one_group, TYPE_SCALE) is None
    with pytest.raises(ValueError, match="two groups"):
        measure_question_map(one_group, TYPE_SCALE)
    scale, bias = fit_map(scores, correct, TYPE_SCALE)
    assert math.isfinite(scale) and all(math.isfinite(b) for b in bias)


@pytest.mark.parametrize(
    ("scores", "correct", "message"),
    [
        ([[0.0, -1.0], [0.0, -1.0, -2.0]], [0, 0], "same options"),
        ([[0.0, math.nan]], [0], "finite or -inf"),
        ([[0.0, -1.0]], [2], "outside"),
        ([[0.0]], [0], "two options"),
    ],
)
def test_malformed_labels_are_refused(scores, correct, message):
    with pytest.raises(ValueError, match=message):
        fit_map(scores, correct, TYPE_SCALE)
