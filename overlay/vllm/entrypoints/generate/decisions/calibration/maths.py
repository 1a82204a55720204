# SPDX-License-Identifier: Apache-2.0
"""The arithmetic of calibration: fit a temperature, test it on held-out folds, measure ECE. Ragged
score lists are packed into one matrix padded with ``-inf``, which keeps every step vectorised."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
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


def _pack(
    scores: Sequence[Sequence[float]], correct: Sequence[int]
) -> tuple[FloatArray, BoolArray, IntArray]:
    """Ragged score lists as an (N, K) matrix padded with ``-inf``, the mask of real options, and the
    correct indices, checked."""
    if not scores:
        raise ValueError("no questions to calibrate on")
    widths = [len(row) for row in scores]
    if min(widths) < 1:
        raise ValueError("every question needs at least one option score")
    matrix = np.full((len(scores), max(widths)), -np.inf, dtype=np.float64)
    for i, row in enumerate(scores):
        matrix[i, : len(row)] = row
    real = np.arange(matrix.shape[1]) < np.asarray(widths)[:, None]
    # -inf is a legitimate score (an option the backend ruled out); NaN and +inf are not.
    if np.isnan(matrix).any() or np.isposinf(matrix).any():
        raise ValueError("option scores must be finite or -inf")
    answer = np.asarray(correct, dtype=np.int64)
    if answer.shape != (len(scores),):
        raise ValueError(
            f"got {len(scores)} score lists but {answer.size} correct indices"
        )
    if (answer < 0).any() or (answer >= np.asarray(widths)).any():
        raise ValueError("a correct index is outside its question's options")
    return matrix, real, answer


def group_index(groups: Sequence[str]) -> tuple[IntArray, int]:
    """Each group's number (in order of first appearance), and how many groups there are."""
    number: dict[str, int] = {}
    index = [number.setdefault(g, len(number)) for g in groups]
    return np.asarray(index, dtype=np.int64), len(number)


@dataclass(frozen=True)
class Labelled:
    """Labelled reads, as columns: each question's option scores, the index of its right option, and
    its group (a group's questions are not independent evidence: folds and resamples keep it whole)."""

    scores: Sequence[Sequence[float]]
    correct: Sequence[int]
    groups: Sequence[str]

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.correct):
            raise ValueError(
                f"got {len(self.correct)} labelled answers but {len(self.groups)} groups"
            )

    def rows(self, picked: Sequence[int]) -> Labelled:
        return Labelled(
            [self.scores[i] for i in picked],
            [self.correct[i] for i in picked],
            [self.groups[i] for i in picked],
        )


def rows_by_name(names: Sequence[str]) -> dict[str, list[int]]:
    """The rows of each name (a type's, a question's key), in order of first appearance."""
    rows: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        rows.setdefault(name, []).append(index)
    return rows


def _log_softmax(matrix: FloatArray, real: BoolArray, temperature: float) -> FloatArray:
    """``log softmax(scores / T)``; an all ``-inf`` row is uniform, as the per-answer softmax is."""
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
    low: float = LOW_TEMPERATURE,
    high: float = HIGH_TEMPERATURE,
    tolerance: float = 1e-4,
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
    # An optimum beyond the range is reported as the edge itself, so the caller can recognise it; an
    # edge that merely ties the bracket (NLL flat out to the edge) counts as the optimum.
    middle = (a + b) / 2.0
    return min(
        (cost(math.log(low)), 0, low),
        (cost(math.log(high)), 1, high),
        (cost(middle), 2, math.exp(middle)),
    )[2]


def _softmax_rows(
    matrix: FloatArray, real: BoolArray, temperature: float
) -> list[list[float]]:
    """Each row's probability vector, trimmed back to its question's own options."""
    probabilities = np.exp(_log_softmax(matrix, real, temperature))
    widths = real.sum(axis=1)
    return [probabilities[i, : widths[i]].tolist() for i in range(len(widths))]


def nll(
    scores: Sequence[Sequence[float]], correct: Sequence[int], temperature: float
) -> float:
    """Mean negative log-likelihood, the quantity T minimises."""
    return _nll(*_pack(scores, correct), temperature)


def fit_temperature(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    low: float = LOW_TEMPERATURE,
    high: float = HIGH_TEMPERATURE,
    tolerance: float = 1e-4,
) -> float:
    """The T minimising :func:`nll`, by golden-section search over ``log T``: the range spans a factor
    of 400, and the NLL, convex in ``1/T``, is unimodal in ``log T``."""
    return _fit(*_pack(scores, correct), low, high, tolerance)


def fold_of_groups(
    groups: Sequence[str], folds: int = FOLDS, seed: int = 0
) -> list[int]:
    """A fold index per question, the questions of a group in one fold, folds balanced by size."""
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
    labelled: Labelled, folds: int = FOLDS, seed: int = 0
) -> list[list[float]]:
    """Each question's probabilities under a T fitted on the other folds, for an honest ECE."""
    matrix, real, answer = _pack(labelled.scores, labelled.correct)
    fold = np.asarray(fold_of_groups(labelled.groups, folds, seed), dtype=np.int64)
    used = np.unique(fold)
    if used.size < 2:
        raise ValueError("cross-validation needs at least two distinct groups")
    result: list[list[float]] = [[] for _ in range(answer.size)]
    for f in used:
        held = fold == f
        temperature = _fit(matrix[~held], real[~held], answer[~held])
        probabilities = _softmax_rows(matrix, real, temperature)
        for i in np.flatnonzero(held):
            result[i] = probabilities[i]
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
    if not ((confidence >= -1e-9) & (confidence <= 1 + 1e-9)).all():  # NaN fails too
        raise ValueError("top probabilities must lie in [0, 1]")
    return np.clip(confidence, 0.0, 1.0), correct


def ece(
    top_probabilities: Sequence[float], hits: Sequence[bool], bins: int = BINS
) -> float:
    """Expected calibration error over equal-width bins of the top option's probability."""
    confidence, correct = _check_ece_inputs(top_probabilities, hits, bins)
    index = _bin_indices(confidence, bins)
    hit_sum = np.bincount(index, weights=correct, minlength=bins)
    confidence_sum = np.bincount(index, weights=confidence, minlength=bins)
    return float(np.abs(hit_sum - confidence_sum).sum() / confidence.size)


def group_weights(count: int, resamples: int, seed: int) -> Iterator[FloatArray]:
    """Each bootstrap resample as how often each of ``count`` groups was drawn (with replacement)."""
    rng = np.random.default_rng(seed)
    for _ in range(resamples):
        yield np.bincount(rng.integers(0, count, size=count), minlength=count).astype(
            np.float64
        )


def gain_interval(
    gains: Sequence[float],
    groups: Sequence[str],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """95% interval of the mean per-question gain, resampling question groups."""
    index, count = group_index(groups)
    totals = np.bincount(index, weights=gains, minlength=count)
    sizes = np.bincount(index, minlength=count).astype(np.float64)
    values = [w @ totals / (w @ sizes) for w in group_weights(count, resamples, seed)]
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def bootstrap_interval(
    top_probabilities: Sequence[float],
    hits: Sequence[bool],
    groups: Sequence[str],
    resamples: int = RESAMPLES,
    seed: int = 0,
    bins: int = BINS,
) -> tuple[float, float]:
    """95% interval of ECE, resampling groups: a group's questions are not independent evidence."""
    confidence, correct = _check_ece_inputs(top_probabilities, hits, bins)
    if len(groups) != confidence.size:
        raise ValueError(
            f"got {confidence.size} answers but {len(groups)} group labels"
        )
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    group, count = group_index(groups)
    # Per-group, per-bin totals: a resample's ECE is then a weighted sum of these rows.
    bin_index = _bin_indices(confidence, bins)
    hit_sum = np.zeros((count, bins))
    confidence_sum = np.zeros((count, bins))
    np.add.at(hit_sum, (group, bin_index), correct)
    np.add.at(confidence_sum, (group, bin_index), confidence)
    sizes = np.bincount(group, minlength=count).astype(np.float64)
    gap = hit_sum - confidence_sum

    values = [
        np.abs(w @ gap).sum() / (w @ sizes)
        for w in group_weights(count, resamples, seed)
    ]
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def newton_minimum(
    objective: Callable[[FloatArray], float],
    derivatives: Callable[[FloatArray], tuple[FloatArray, FloatArray]],
    start: FloatArray,
    tolerance: float,
) -> FloatArray:
    """The minimum of a convex ``objective`` by damped Newton, its first parameter 1/T in range."""
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


@dataclass(frozen=True)
class CalibrationResult:
    temperature: float  # fitted on all questions
    kept: bool  # the calibrated ECE interval lies wholly below the raw one
    ece_raw: float
    ece_raw_interval: tuple[float, float]
    ece_calibrated: float  # on held-out (cross-validated) probabilities
    ece_calibrated_interval: tuple[float, float]
    questions: int
    # T hit the range's edge: broken scores, which the caller treats as a failure
    at_edge: bool

    @property
    def at_top(self) -> bool:
        """T hit the range's top: on these questions the scores say next to nothing."""
        return self.at_edge and self.temperature > 1.0

    @property
    def applied_temperature(self) -> float:
        """The fitted T if kept, else 1.0 (also 1.0 at an edge)."""
        return self.temperature if self.kept and not self.at_edge else 1.0


def top_and_hits(
    probabilities: Sequence[Sequence[float]], correct: Sequence[int]
) -> tuple[list[float], list[bool]]:
    tops = [max(row) for row in probabilities]
    hits = [
        int(np.argmax(row)) == answer
        for row, answer in zip(probabilities, correct, strict=True)
    ]
    return tops, hits


def calibrate(
    labelled: Labelled,
    seed: int = 0,
    *,
    folds: int = FOLDS,
    resamples: int = RESAMPLES,
) -> CalibrationResult:
    """Fit T, test it on held-out folds, and keep it only if the ECE gain is clearly real."""
    correct, groups = labelled.correct, labelled.groups
    matrix, real, answer = _pack(labelled.scores, correct)
    temperature = _fit(matrix, real, answer)
    held_out = cross_validated_probabilities(labelled, folds, seed)
    raw = _softmax_rows(matrix, real, 1.0)

    raw_top, raw_hits = top_and_hits(raw, correct)
    held_top, held_hits = top_and_hits(held_out, correct)
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
        at_edge=any(
            abs(temperature - edge) <= EDGE_TOLERANCE * edge
            for edge in (LOW_TEMPERATURE, HIGH_TEMPERATURE)
        ),
    )
