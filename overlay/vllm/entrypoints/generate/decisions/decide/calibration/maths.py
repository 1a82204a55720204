# SPDX-License-Identifier: Apache-2.0
"""The arithmetic of startup calibration: fit a temperature, test it on held-out folds, and measure ECE.

Pure functions over plain sequences, so the decision to keep a temperature can be tested without an engine.
Option score lists may differ in length per question; internally they are packed into one matrix padded
with ``-inf`` (an option that can never get probability), which keeps every step vectorised.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

LOW_TEMPERATURE = 0.05
HIGH_TEMPERATURE = 20.0
# A fitted T this close (relative) to either end of the range points to broken scores, not a real T.
EDGE_TOLERANCE = 1e-3
FOLDS = 5
BINS = 10
RESAMPLES = 1000
NEWTON_STEPS = 50

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


# --- packing ----------------------------------------------------------------------------------


def _pack(scores: Sequence[Sequence[float]]) -> tuple[FloatArray, BoolArray]:
    """Ragged score lists as an (N, K) matrix padded with ``-inf``, plus the mask of real options."""
    if not scores:
        raise ValueError("no questions to calibrate on")
    widths = [len(row) for row in scores]
    if min(widths) < 1:
        raise ValueError("every question needs at least one option score")
    matrix = np.full((len(scores), max(widths)), -np.inf, dtype=np.float64)
    real = np.zeros(matrix.shape, dtype=np.bool_)
    for i, row in enumerate(scores):
        matrix[i, : len(row)] = row
        real[i, : len(row)] = True
    # -inf is a legitimate score (an option the backend ruled out); NaN and +inf are not.
    if np.isnan(matrix).any() or np.isposinf(matrix).any():
        raise ValueError("option scores must be finite or -inf")
    return matrix, real


def _pack_correct(correct: Sequence[int], real: BoolArray) -> IntArray:
    """The correct option indices, checked against each question's own number of options."""
    answer = np.asarray(correct, dtype=np.int64)
    if answer.shape != (real.shape[0],):
        raise ValueError(
            f"got {real.shape[0]} score lists but {answer.size} correct indices"
        )
    widths = real.sum(axis=1)
    if (answer < 0).any() or (answer >= widths).any():
        raise ValueError("a correct index is outside its question's options")
    return answer


def _log_softmax(matrix: FloatArray, real: BoolArray, temperature: float) -> FloatArray:
    """Row-wise ``log softmax(scores / T)`` via log-sum-exp; padding stays at ``-inf``.

    A row whose scores are all ``-inf`` has no preference, so it gets the uniform distribution over its
    real options (the same convention as the per-answer softmax).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    scaled = matrix / temperature
    top = scaled.max(axis=1, keepdims=True)
    dead = np.isneginf(top[:, 0])
    if dead.any():
        scaled[dead] = np.where(real[dead], 0.0, -np.inf)
        top[dead] = 0.0
    log_total = top + np.log(np.exp(scaled - top).sum(axis=1, keepdims=True))
    return scaled - log_total


def _nll(
    matrix: FloatArray, real: BoolArray, answer: IntArray, temperature: float
) -> float:
    picked = _log_softmax(matrix, real, temperature)[np.arange(answer.size), answer]
    return float(-picked.mean())


def _fit(
    matrix: FloatArray,
    real: BoolArray,
    answer: IntArray,
    low: float,
    high: float,
    tolerance: float,
) -> float:
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low}, high={high}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    # A question whose correct option scores -inf costs +inf at every T: it says nothing about T.
    informative = np.isfinite(matrix[np.arange(answer.size), answer])
    if not informative.any():
        raise ValueError("no question has a finite score on its correct option")
    matrix, real, answer = matrix[informative], real[informative], answer[informative]

    def cost(log_t: float) -> float:
        return _nll(matrix, real, answer, math.exp(log_t))

    a, b = math.log(low), math.log(high)
    c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    fc, fd = cost(c), cost(d)
    while b - a > tolerance:
        if fc <= fd:  # the minimum lies in [a, d]
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = cost(c)
        else:  # the minimum lies in [c, b]
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = cost(d)
    # If the optimum lies beyond the range, report the edge itself so the caller can recognise it. An edge
    # that merely ties the bracket (NLL flat out to the edge, or equal once rounded) counts as the optimum.
    middle = (a + b) / 2.0
    best = min(
        (
            (cost(math.log(low)), 0, low),
            (cost(math.log(high)), 1, high),
            (cost(middle), 2, math.exp(middle)),
        )
    )
    return best[2]


def _softmax_rows(
    matrix: FloatArray,
    real: BoolArray,
    temperature: float,
    rows: Sequence[int] | IntArray,
) -> list[list[float]]:
    """Probability vectors for the chosen rows, each trimmed back to its question's own options."""
    probabilities = np.exp(_log_softmax(matrix, real, temperature))
    widths = real.sum(axis=1)
    return [probabilities[i, : widths[i]].tolist() for i in rows]


# --- public functions -------------------------------------------------------------------------


def nll(
    scores: Sequence[Sequence[float]], correct: Sequence[int], temperature: float
) -> float:
    """Mean negative log-likelihood ``-mean(log softmax(scores_i / T)[correct_i])``, the quantity T minimises.

    Computed with log-sum-exp, so large scores and small T do not overflow. ``-inf`` scores are allowed;
    if a correct option itself scores ``-inf`` the result is ``inf``, which is the true value.
    """
    matrix, real = _pack(scores)
    return _nll(matrix, real, _pack_correct(correct, real), temperature)


def fit_temperature(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    low: float = LOW_TEMPERATURE,
    high: float = HIGH_TEMPERATURE,
    tolerance: float = 1e-4,
) -> float:
    """The T in ``[low, high]`` that minimises :func:`nll`, by golden-section search over ``log T``.

    The search runs in ``log T`` because the range spans a factor of 400: equal steps in ``log T`` give the
    same relative precision at 0.05 as at 20, and ``tolerance`` is the final bracket's width in ``log T``
    (so about that relative error in T). The NLL is convex in ``1/T``, hence unimodal along any monotone
    reparametrisation such as ``log T``, which is what golden-section needs. Questions whose correct
    option scores ``-inf`` are left out (they cost ``inf`` at every T). If the optimum lies outside the
    range the matching edge is returned exactly.
    """
    matrix, real = _pack(scores)
    return _fit(matrix, real, _pack_correct(correct, real), low, high, tolerance)


def fold_of_groups(
    groups: Sequence[str], folds: int = FOLDS, seed: int = 0
) -> list[int]:
    """A fold index per question; questions that share a group always share a fold.

    Groups are shuffled with ``random.Random(seed)``, then placed largest first (ties keep the shuffled
    order) each into the fold with the fewest questions so far, which keeps folds balanced by question
    count. The result depends only on the group labels in order of first appearance and the seed.
    """
    if folds < 1:
        raise ValueError(f"folds must be at least 1, got {folds}")
    sizes = Counter(groups)
    order = list(sizes)  # first-appearance order, so the shuffle is reproducible
    random.Random(seed).shuffle(order)
    order.sort(key=lambda group: -sizes[group])
    loads = [0] * folds
    fold_of: dict[str, int] = {}
    for group in order:
        smallest = min(range(folds), key=lambda f: (loads[f], f))
        fold_of[group] = smallest
        loads[smallest] += sizes[group]
    return [fold_of[group] for group in groups]


def cross_validated_probabilities(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    folds: int = FOLDS,
    seed: int = 0,
) -> list[list[float]]:
    """Each question's probabilities under a T fitted only on the other folds, in the original order.

    This is what makes the calibrated ECE honest: no question is scored by a T that saw its answer.
    """
    matrix, real = _pack(scores)
    answer = _pack_correct(correct, real)
    if len(groups) != answer.size:
        raise ValueError(f"got {answer.size} questions but {len(groups)} group labels")
    fold = np.asarray(fold_of_groups(groups, folds, seed), dtype=np.int64)
    used = np.unique(fold)
    if used.size < 2:
        raise ValueError("cross-validation needs at least two distinct groups")
    result: list[list[float]] = [[] for _ in range(answer.size)]
    for f in used:
        held = fold == f
        train = ~held
        temperature = _fit(
            matrix[train],
            real[train],
            answer[train],
            LOW_TEMPERATURE,
            HIGH_TEMPERATURE,
            1e-4,
        )
        rows = np.flatnonzero(held)
        for i, probabilities in zip(
            rows, _softmax_rows(matrix, real, temperature, rows), strict=True
        ):
            result[i] = probabilities
    return result


def _bin_indices(top_probabilities: FloatArray, bins: int) -> IntArray:
    """Equal-width bin of each probability; ``[k/bins, (k+1)/bins)``, with 1.0 in the last bin."""
    return np.minimum(np.floor(top_probabilities * bins), bins - 1).astype(np.int64)


def _check_ece_inputs(
    top_probabilities: Sequence[float], hits: Sequence[bool], bins: int
) -> tuple[FloatArray, FloatArray]:
    confidence = np.asarray(top_probabilities, dtype=np.float64)
    correct = np.asarray(hits, dtype=np.float64)
    if confidence.ndim != 1 or confidence.shape != correct.shape:
        raise ValueError(f"got {confidence.size} probabilities but {correct.size} hits")
    if confidence.size == 0:
        raise ValueError("ECE needs at least one answer")
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    if (
        np.isnan(confidence).any()
        or (confidence < -1e-9).any()
        or (confidence > 1 + 1e-9).any()
    ):
        raise ValueError("top probabilities must lie in [0, 1]")
    return np.clip(confidence, 0.0, 1.0), correct


def ece(
    top_probabilities: Sequence[float], hits: Sequence[bool], bins: int = BINS
) -> float:
    """Expected calibration error: ``sum over bins (n_bin / N) * |accuracy_bin - confidence_bin|``.

    Bins are equal-width over [0, 1] on the top option's probability; a probability of exactly 1.0 falls
    in the last bin. Per bin, ``n * |accuracy - confidence|`` equals ``|hits - sum of confidences|``,
    which is how it is computed.
    """
    confidence, correct = _check_ece_inputs(top_probabilities, hits, bins)
    index = _bin_indices(confidence, bins)
    hit_sum = np.bincount(index, weights=correct, minlength=bins)
    confidence_sum = np.bincount(index, weights=confidence, minlength=bins)
    return float(np.abs(hit_sum - confidence_sum).sum() / confidence.size)


def bootstrap_interval(
    top_probabilities: Sequence[float],
    hits: Sequence[bool],
    groups: Sequence[str],
    resamples: int = RESAMPLES,
    seed: int = 0,
    bins: int = BINS,
) -> tuple[float, float]:
    """95% interval of ECE (2.5th and 97.5th percentiles) from resampling question groups with replacement.

    Groups, not questions, are resampled because questions in a group are not independent evidence. Each
    resample draws as many groups as there are distinct groups and takes every question of each drawn
    group. Reproducible for a given seed and group labels (groups are numbered in order of first appearance).
    """
    confidence, correct = _check_ece_inputs(top_probabilities, hits, bins)
    if len(groups) != confidence.size:
        raise ValueError(
            f"got {confidence.size} answers but {len(groups)} group labels"
        )
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    number: dict[str, int] = {}
    group_index = np.asarray(
        [number.setdefault(g, len(number)) for g in groups], dtype=np.int64
    )
    count = len(number)
    # Per-group, per-bin totals: a resample's ECE is then a weighted sum of these rows.
    bin_index = _bin_indices(confidence, bins)
    hit_sum = np.zeros((count, bins))
    confidence_sum = np.zeros((count, bins))
    np.add.at(hit_sum, (group_index, bin_index), correct)
    np.add.at(confidence_sum, (group_index, bin_index), confidence)
    sizes = np.bincount(group_index, minlength=count).astype(np.float64)
    gap = hit_sum - confidence_sum

    rng = np.random.default_rng(seed)
    values = np.empty(resamples)
    for r in range(resamples):
        weight = np.bincount(
            rng.integers(0, count, size=count), minlength=count
        ).astype(np.float64)
        values[r] = np.abs(weight @ gap).sum() / (weight @ sizes)
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


# --- a slope and intercepts: damped Newton -------------------------------------------------------


def newton_minimum(
    objective: Callable[[FloatArray], float],
    derivatives: Callable[[FloatArray], tuple[FloatArray, FloatArray]],
    start: FloatArray,
    tolerance: float,
) -> FloatArray:
    """The minimum of a convex ``objective`` whose first parameter is a slope (1/T), from ``start``.

    Each Newton step (``derivatives``: the gradient and Hessian at a point) is halved until the
    objective does not rise, the slope held within the temperature range; the search stops when a
    step gains less than ``tolerance`` or no step helps."""
    theta = start.copy()
    current = objective(theta)
    for _ in range(NEWTON_STEPS):
        gradient, hessian = derivatives(theta)
        step = np.linalg.solve(hessian, gradient)
        length = 1.0
        while length > 1e-6:
            proposal = theta - length * step
            proposal[0] = min(
                max(proposal[0], 1.0 / HIGH_TEMPERATURE), 1.0 / LOW_TEMPERATURE
            )
            value = objective(proposal)
            if value <= current:
                break
            length /= 2
        else:
            break
        gained = current - value
        theta, current = proposal, value
        if gained < tolerance:
            break
    return theta


# --- the whole procedure ----------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationResult:
    """Everything the server saves and logs about one calibration run."""

    temperature: float  # fitted on all questions
    kept: bool  # the calibrated ECE interval lies wholly below the raw one
    ece_raw: float
    ece_raw_interval: tuple[float, float]
    ece_calibrated: float  # on held-out (cross-validated) probabilities
    ece_calibrated_interval: tuple[float, float]
    questions: int
    at_edge: (
        bool  # T hit the range's edge: broken scores, the caller treats it as a failure
    )

    @property
    def at_top(self) -> bool:
        """T hit the range's top: on these questions the scores say next to nothing."""
        return self.at_edge and self.temperature > 1.0

    @property
    def applied_temperature(self) -> float:
        """The T answers get: the fitted one if kept, else 1.0 (also 1.0 when T landed at an edge)."""
        return self.temperature if self.kept and not self.at_edge else 1.0


def _top_and_hits(
    probabilities: Sequence[Sequence[float]], correct: Sequence[int]
) -> tuple[list[float], list[bool]]:
    tops = [max(row) for row in probabilities]
    hits = [
        int(np.argmax(row)) == answer
        for row, answer in zip(probabilities, correct, strict=True)
    ]
    return tops, hits


def _near_edge(temperature: float) -> bool:
    return any(
        abs(temperature - edge) <= EDGE_TOLERANCE * edge
        for edge in (LOW_TEMPERATURE, HIGH_TEMPERATURE)
    )


def calibrate(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    seed: int = 0,
    *,
    folds: int = FOLDS,
    resamples: int = RESAMPLES,
) -> CalibrationResult:
    """Fit T, test it on held-out folds, and keep it only if the ECE gain is clearly real.

    Both ECE intervals use the same seed, so they are computed on the same resampled group sets.
    """
    matrix, real = _pack(scores)
    answer = _pack_correct(correct, real)
    temperature = _fit(matrix, real, answer, LOW_TEMPERATURE, HIGH_TEMPERATURE, 1e-4)
    held_out = cross_validated_probabilities(scores, correct, groups, folds, seed)
    raw = _softmax_rows(matrix, real, 1.0, range(answer.size))

    raw_top, raw_hits = _top_and_hits(raw, correct)
    held_top, held_hits = _top_and_hits(held_out, correct)
    raw_interval = bootstrap_interval(raw_top, raw_hits, groups, resamples, seed)
    held_interval = bootstrap_interval(held_top, held_hits, groups, resamples, seed)
    return CalibrationResult(
        temperature=temperature,
        kept=held_interval[1] < raw_interval[0],
        ece_raw=ece(raw_top, raw_hits),
        ece_raw_interval=raw_interval,
        ece_calibrated=ece(held_top, held_hits),
        ece_calibrated_interval=held_interval,
        questions=answer.size,
        at_edge=_near_edge(temperature),
    )
