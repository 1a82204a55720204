"""The calibration arithmetic: temperature fit, grouped folds, held-out probabilities, ECE and its interval."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from vllm.entrypoints.generate.decisions.calibration.maths import (
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    CalibrationResult,
    Labelled,
    bootstrap_interval,
    calibrate,
    cross_validated_probabilities,
    ece,
    fit_temperature,
    fold_of_groups,
    nll,
)


def synthetic(
    count: int, scale: float, seed: int
) -> tuple[list[list[float]], list[int]]:
    """Questions with 2-6 options whose answers follow softmax(z); the scores shown are z * scale.

    So T = scale is exactly the temperature that makes the scores honest again.
    """
    rng = np.random.default_rng(seed)
    scores: list[list[float]] = []
    correct: list[int] = []
    for _ in range(count):
        k = int(rng.integers(2, 7))
        z = rng.normal(0.0, 1.5, size=k)
        p = np.exp(z - z.max())
        correct.append(int(rng.choice(k, p=p / p.sum())))
        scores.append((z * scale).tolist())
    return scores, correct


def softmax(row: list[float], temperature: float) -> list[float]:
    top = max(row)
    weights = [math.exp((s - top) / temperature) for s in row]
    return [w / sum(weights) for w in weights]


# --- nll and the fit --------------------------------------------------------------------------


def test_nll_matches_direct_formula():
    scores = [[2.0, 0.0, -1.0], [0.5, 1.5]]
    correct = [0, 1]
    for t in (0.5, 1.0, 3.0):
        expected = (
            -(math.log(softmax(scores[0], t)[0]) + math.log(softmax(scores[1], t)[1]))
            / 2
        )
        assert nll(scores, correct, t) == pytest.approx(expected)


def test_nll_is_stable_and_handles_minus_infinity():
    # Scores this large overflow a naive exp; the answer is still log(1 + e^-10).
    assert nll([[1000.0, 990.0]], [0], 1.0) == pytest.approx(
        math.log1p(math.exp(-10.0))
    )
    # A ruled-out option gets no probability and does not disturb the rest.
    assert nll([[0.0, 0.0, -math.inf]], [0], 2.0) == pytest.approx(math.log(2.0))
    # A correct option that scored -inf is infinitely unlikely.
    assert nll([[0.0, -math.inf]], [1], 1.0) == math.inf


@pytest.mark.parametrize("planted", [0.3, 1.0, 4.0])
def test_fit_recovers_a_planted_temperature(planted):
    scores, correct = synthetic(2000, planted, seed=11)
    fitted = fit_temperature(scores, correct)
    assert fitted == pytest.approx(planted, rel=0.10)
    # It is a minimum: halving or doubling T makes the correct answers less likely.
    assert nll(scores, correct, fitted) < nll(scores, correct, fitted / 2)
    assert nll(scores, correct, fitted) < nll(scores, correct, fitted * 2)


def test_fit_ignores_questions_whose_answer_scored_minus_infinity():
    scores, correct = synthetic(500, 2.0, seed=3)
    with_dead = [*scores, [0.0, -math.inf]]
    assert fit_temperature(with_dead, [*correct, 1]) == pytest.approx(
        fit_temperature(scores, correct)
    )


def test_fit_reports_the_edge_when_the_optimum_lies_outside_the_range():
    # Answers unrelated to the scores: the best T is infinite.
    rng = np.random.default_rng(5)
    noise = [rng.normal(0, 3, size=4).tolist() for _ in range(300)]
    assert (
        fit_temperature(noise, [int(i) for i in rng.integers(0, 4, size=300)])
        == HIGH_TEMPERATURE
    )
    # The answer always scores highest by a wide margin: the best T is zero.
    certain = [[5.0, 0.0, 1.0] for _ in range(50)]
    assert fit_temperature(certain, [0] * 50) == LOW_TEMPERATURE


# --- folds ------------------------------------------------------------------------------------


def test_folds_keep_groups_together_and_are_balanced():
    rng = np.random.default_rng(0)
    groups = [f"g{i}" for i in range(120) for _ in range(int(rng.integers(1, 4)))]
    fold = fold_of_groups(groups, folds=5, seed=0)
    assert set(fold) == set(range(5))
    by_group: dict[str, set[int]] = {}
    for group, f in zip(groups, fold, strict=True):
        by_group.setdefault(group, set()).add(f)
    assert all(len(fs) == 1 for fs in by_group.values())
    sizes = Counter(fold).values()
    assert max(sizes) - min(sizes) <= 3  # no worse than the largest group


def test_folds_are_deterministic_for_a_seed():
    groups = [f"g{i // 2}" for i in range(200)]
    assert fold_of_groups(groups, seed=4) == fold_of_groups(groups, seed=4)
    assert fold_of_groups(groups, seed=4) != fold_of_groups(groups, seed=5)


def test_fewer_groups_than_folds_leaves_folds_empty():
    assert sorted(fold_of_groups(["a", "a", "b"], folds=5)) == [0, 0, 1]


# --- cross-validation -------------------------------------------------------------------------


def test_cross_validated_probabilities_use_a_temperature_fitted_without_their_fold():
    scores, correct = synthetic(400, 3.0, seed=8)
    groups = [f"g{i // 2}" for i in range(400)]
    fold = fold_of_groups(groups)
    held_out = cross_validated_probabilities(Labelled(scores, correct, groups))
    for f in range(5):
        train = [i for i in range(400) if fold[i] != f]
        t = fit_temperature([scores[i] for i in train], [correct[i] for i in train])
        for i in range(400):
            if fold[i] == f:
                assert held_out[i] == pytest.approx(softmax(scores[i], t))


def test_a_folds_own_answers_never_move_its_probabilities():
    scores, correct = synthetic(300, 2.0, seed=9)
    groups = [f"g{i // 3}" for i in range(300)]
    fold = fold_of_groups(groups)
    before = cross_validated_probabilities(Labelled(scores, correct, groups))
    # Rewrite fold 0's answers to the least likely option: fold 0's own probabilities must not change.
    rigged = [
        int(np.argmin(s)) if fold[i] == 0 else correct[i] for i, s in enumerate(scores)
    ]
    after = cross_validated_probabilities(Labelled(scores, rigged, groups))
    for i in range(300):
        if fold[i] == 0:
            assert after[i] == pytest.approx(before[i])
        else:
            assert after[i] != pytest.approx(before[i])


def test_a_fold_with_another_scale_gets_the_other_folds_temperature():
    # Fold 0 is 8x overconfident, the rest are honest: fold 0 is scored with a T near 1, not near 8.
    groups = [f"g{i // 2}" for i in range(500)]
    fold = fold_of_groups(groups)
    base, correct = synthetic(500, 1.0, seed=12)
    scores = [
        [s * 8.0 for s in row] if fold[i] == 0 else row for i, row in enumerate(base)
    ]
    held_out = cross_validated_probabilities(Labelled(scores, correct, groups))
    for i in range(500):
        if fold[i] == 0:
            assert max(held_out[i]) >= max(softmax(scores[i], 2.0)) - 1e-9


def test_cross_validation_keeps_each_questions_own_option_count():
    scores = [[1.0, 0.0], [0.0, 1.0, 2.0], [3.0, 0.0, 0.0, 0.0]] * 10
    correct = [0, 2, 0] * 10
    held_out = cross_validated_probabilities(
        Labelled(scores, correct, [str(i) for i in range(30)])
    )
    assert [len(p) for p in held_out] == [len(s) for s in scores]
    assert all(sum(p) == pytest.approx(1.0) for p in held_out)


def test_cross_validation_needs_two_groups():
    with pytest.raises(ValueError, match="two distinct groups"):
        cross_validated_probabilities(
            Labelled([[1.0, 0.0]] * 10, [0] * 10, ["same"] * 10)
        )


# --- ECE --------------------------------------------------------------------------------------


def test_ece_hand_computed_cases():
    # Bin 9 holds 0.95, 0.95 with one hit: |0.5 - 0.95| = 0.45, weight 2/4.
    # Bin 5 holds 0.55, 0.55 with two hits: |1.0 - 0.55| = 0.45, weight 2/4.  ECE = 0.225 + 0.225 = 0.45.
    assert ece([0.95, 0.95, 0.55, 0.55], [True, False, True, True]) == pytest.approx(
        0.45
    )
    # One bin, confidence 0.75, accuracy 3/4: perfectly calibrated.  ECE = 0.
    assert ece([0.75, 0.75, 0.75, 0.75], [True, True, True, False]) == pytest.approx(
        0.0
    )
    # Bin 9 holds 1.0 and 0.92 with one hit: |0.5 - 0.96| = 0.46, weight 2/3 -> 0.306667.
    # Bin 3 holds 0.35, a miss: |0 - 0.35| = 0.35, weight 1/3 -> 0.116667.  ECE = 0.423333.
    assert ece([1.0, 0.92, 0.35], [True, False, False]) == pytest.approx(
        0.46 * 2 / 3 + 0.35 / 3
    )


def test_probability_one_lands_in_the_last_bin():
    # Shared with 0.95 in bin 9: confidence 0.975, accuracy 0.5 -> 0.475.
    # (In a bin of its own it would be 0.5 * |0 - 1.0| + 0.5 * |1 - 0.95| = 0.525.)
    assert ece([1.0, 0.95], [False, True]) == pytest.approx(0.475)


def test_bin_edges_are_closed_below():
    # 0.5 opens bin 5, so it shares nothing with 0.45 in bin 4: 0.5 * 0.5 + 0.5 * 0.55 = 0.525.
    assert ece([0.5, 0.45], [False, True]) == pytest.approx(0.525)


def test_ece_rejects_bad_input():
    with pytest.raises(ValueError):
        ece([], [])
    with pytest.raises(ValueError):
        ece([0.5, 0.6], [True])
    with pytest.raises(ValueError):
        ece([1.5], [True])


# --- bootstrap --------------------------------------------------------------------------------


def bootstrap_inputs() -> tuple[list[float], list[bool], list[str]]:
    rng = np.random.default_rng(21)
    tops = rng.uniform(0.3, 1.0, size=300)
    hits = rng.uniform(size=300) < tops * 0.8
    return tops.tolist(), hits.tolist(), [f"g{i // 3}" for i in range(300)]


def test_bootstrap_is_reproducible_for_a_seed():
    tops, hits, groups = bootstrap_inputs()
    first = bootstrap_interval(tops, hits, groups, seed=1)
    assert first == bootstrap_interval(tops, hits, groups, seed=1)
    assert first != bootstrap_interval(tops, hits, groups, seed=2)
    low, high = first
    assert low <= ece(tops, hits) <= high


def test_bootstrap_resamples_whole_groups():
    # With a single group every resample is the whole set, so the interval collapses onto the ECE.
    tops, hits, _ = bootstrap_inputs()
    low, high = bootstrap_interval(tops, hits, ["one"] * len(tops), resamples=50)
    assert low == pytest.approx(ece(tops, hits))
    assert high == pytest.approx(ece(tops, hits))


def test_bootstrap_matches_recomputing_ece_on_each_resample():
    # The fast per-group sums must agree with a plain loop over the same draws.
    tops, hits, groups = bootstrap_inputs()
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    names = list(members)
    rng = np.random.default_rng(7)
    values = []
    for _ in range(200):
        picked = [
            i
            for d in rng.integers(0, len(names), size=len(names))
            for i in members[names[d]]
        ]
        values.append(ece([tops[i] for i in picked], [hits[i] for i in picked]))
    expected = tuple(np.percentile(values, [2.5, 97.5]))
    assert bootstrap_interval(
        tops, hits, groups, resamples=200, seed=7
    ) == pytest.approx(expected)


# --- the whole procedure ----------------------------------------------------------------------


def test_overconfident_scores_keep_their_temperature():
    scores, correct = synthetic(600, 5.0, seed=31)
    result = calibrate(Labelled(scores, correct, [f"g{i // 2}" for i in range(600)]))
    assert isinstance(result, CalibrationResult)
    assert result.kept
    assert not result.at_edge
    assert result.temperature == pytest.approx(5.0, rel=0.15)
    assert result.applied_temperature == result.temperature
    assert result.ece_calibrated < result.ece_raw
    assert result.ece_calibrated_interval[1] < result.ece_raw_interval[0]
    assert result.questions == 600


def test_calibrated_scores_are_not_corrected():
    scores, correct = synthetic(600, 1.0, seed=32)
    result = calibrate(Labelled(scores, correct, [f"g{i // 2}" for i in range(600)]))
    assert not result.kept
    assert result.applied_temperature == 1.0
    assert result.temperature == pytest.approx(1.0, rel=0.15)


def test_calibrate_flags_a_temperature_at_the_edge():
    rng = np.random.default_rng(6)
    noise = [rng.normal(0, 3, size=3).tolist() for _ in range(200)]
    result = calibrate(
        Labelled(
            noise,
            [int(i) for i in rng.integers(0, 3, size=200)],
            [str(i) for i in range(200)],
        )
    )
    assert result.at_edge
    assert result.applied_temperature == 1.0


def test_calibrate_is_deterministic():
    scores, correct = synthetic(200, 2.0, seed=33)
    groups = [f"g{i // 2}" for i in range(200)]
    labelled = Labelled(scores, correct, groups)
    assert calibrate(labelled, seed=3) == calibrate(labelled, seed=3)
