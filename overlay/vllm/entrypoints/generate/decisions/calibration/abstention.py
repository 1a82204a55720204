# SPDX-License-Identifier: Apache-2.0
"""Abstention: the confidence threshold whose precision reaches the operator's on inputs the fit never
saw; below it an answer abstains (every answer, where no threshold can be trusted to reach it)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from vllm.entrypoints.generate.decisions.calibration.in_force import Abstention
from vllm.entrypoints.generate.decisions.calibration.maths import (
    RESAMPLES,
    BoolArray,
    FloatArray,
    IntArray,
    Labelled,
    cross_validated_probabilities,
    group_index,
    rows_by_name,
    top_and_hits,
)
from vllm.entrypoints.generate.decisions.calibration.question_map import held_out

# Fewer answered labels than this and a precision says too little: the Wilson bound's normal
# approximation and the bootstrap both need a few dozen answers.
MIN_ANSWERED = 20
# Thresholds tried at most (quantiles of the confidences beyond it): a bounded groups x thresholds
# matrix.
MAX_THRESHOLDS = 256
# One-sided 95% lower bounds, as the claim is one-sided. The keep rules' two-sided 97.5% abstained in
# over half of the 300-label fits at 0.9 in the tests' synthetic model, for no gain.
Z = 1.6448536269514722
LOWER_PERCENTILE = 5.0
# Bootstrap weights per chunk (resamples x groups), to keep memory flat for large label files.
CHUNK_CELLS = 2_000_000


def abstains(precision: float, labels: int, groups: int, reason: str) -> Abstention:
    return Abstention(
        precision_asked=precision,
        threshold=None,
        precision_reached=None,
        precision_bound=None,
        coverage=0.0,
        answered=0,
        labels=labels,
        groups=groups,
        reason=reason,
    )


def wilson_lower(hits: FloatArray, answered: FloatArray) -> FloatArray:
    """One-sided 95% Wilson lower bound: below 1 when every answer is right (30 of 30: 0.917)."""
    n = np.maximum(answered, 1.0)
    share = hits / n
    z2 = Z * Z
    centre = share + z2 / (2 * n)
    spread = Z * np.sqrt(share * (1 - share) / n + z2 / (4 * n * n))
    return np.where(answered > 0, (centre - spread) / (1 + z2 / n), 0.0)


def _candidates(confidence: FloatArray) -> FloatArray:
    """The thresholds tried, ascending: every distinct confidence, or MAX_THRESHOLDS quantiles."""
    distinct = np.unique(confidence)
    if distinct.size <= MAX_THRESHOLDS:
        return distinct
    levels = np.linspace(0.0, 1.0, MAX_THRESHOLDS)
    return np.unique(np.quantile(confidence, levels, method="inverted_cdf"))


def _per_group_counts(
    confidence: FloatArray,
    hit: BoolArray,
    group: IntArray,
    count: int,
    thresholds: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """(groups x thresholds) counts of answers that clear each threshold, and of those right."""
    highest = np.searchsorted(thresholds, confidence, side="right") - 1
    clears_any = highest >= 0
    cells = (group[clears_any], highest[clears_any])
    counts = np.zeros((2, count, thresholds.size))  # answered at most, right at most
    np.add.at(counts[0], cells, 1.0)
    np.add.at(counts[1], cells, hit[clears_any])
    answered, right = np.cumsum(counts[:, :, ::-1], axis=2)[:, :, ::-1]
    return answered, right


def grouped_lower(
    answered: FloatArray, right: FloatArray, resamples: int, seed: int
) -> FloatArray:
    """Per threshold, the 5th percentile of precision over resamples of groups (none answered: 0, as a
    threshold only a few groups reach proves nothing)."""
    count = answered.shape[0]
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_CELLS // count)
    values = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        draws = rng.integers(0, count, size=(rows, count))
        draws += np.arange(rows)[:, None] * count
        weight = np.bincount(draws.ravel(), minlength=rows * count).reshape(rows, count)
        total = weight @ answered
        hits = weight @ right
        values.append(np.where(total > 0, hits / np.maximum(total, 1.0), 0.0))
    return np.percentile(np.vstack(values), LOWER_PERCENTILE, axis=0)


def fit_abstention(
    confidences: Sequence[float],
    correct: Sequence[bool],
    groups: Sequence[str],
    precision: float,
    resamples: int = RESAMPLES,
    seed: int = 0,
    min_answered: int = MIN_ANSWERED,
) -> Abstention:
    """The lowest threshold that ``min_answered`` labels clear with a precision bound of ``precision``.

    The bound is the lower of two: Wilson's overstates the evidence of a group's answers that succeed
    or fail together, the grouped bootstrap collapses to 1 when all it resamples are right. A bound,
    not the observed precision, allows for choosing among many thresholds: on the tests' synthetic
    models (160 fits) the observed rule reached the asked precision on fresh answers in 84 fits (0.734
    for 0.8), this one in 153 (at worst 0.009 below), answering 43-87% instead of 65-99%."""
    if resamples < 1 or min_answered < 1:
        raise ValueError("resamples and min_answered must be at least 1")
    if not 0.0 < precision < 1.0:
        raise ValueError(f"the precision asked for must lie in (0, 1), got {precision}")
    confidence = np.asarray(confidences, dtype=np.float64)
    hit = np.asarray(correct, dtype=np.bool_)
    if confidence.ndim != 1 or confidence.shape != hit.shape:
        raise ValueError(f"got {confidence.size} confidences but {hit.size} outcomes")
    if len(groups) != confidence.size:
        raise ValueError(
            f"got {confidence.size} confidences but {len(groups)} group labels"
        )
    if not ((confidence >= 0.0) & (confidence <= 1.0)).all():  # NaN fails too
        raise ValueError("confidences must be probabilities in [0, 1]")
    group, count = group_index(groups)
    labels = int(confidence.size)

    def abstain(reason: str) -> Abstention:
        return abstains(precision, labels, count, reason)

    if labels < min_answered:
        return abstain(
            f"too few labelled answers ({labels} < {min_answered}) to fit a threshold"
        )
    thresholds = _candidates(confidence)
    by_group, right_by_group = _per_group_counts(
        confidence, hit, group, count, thresholds
    )
    answered = by_group.sum(axis=0)
    right = right_by_group.sum(axis=0)
    bound = np.minimum(
        wilson_lower(right, answered),
        grouped_lower(by_group, right_by_group, resamples, seed),
    )
    enough = answered >= min_answered
    qualifies = np.flatnonzero(enough & (bound >= precision))
    if qualifies.size == 0:
        best = int(np.argmax(np.where(enough, bound, -1.0)))
        return abstain(
            f"no threshold reaches precision {precision:g} on held-out labels: the best 95% lower "
            f"bound is {bound[best]:.3f} (threshold {thresholds[best]:.3f}, "
            f"{int(answered[best])} of {labels} answers), so every answer abstains"
        )
    k = int(qualifies[0])
    return Abstention(
        precision_asked=precision,
        threshold=float(thresholds[k]),
        precision_reached=float(right[k] / answered[k]),
        precision_bound=float(bound[k]),
        coverage=float(answered[k] / labels),
        answered=int(answered[k]),
        labels=labels,
        groups=count,
    )


def type_thresholds(
    types: Sequence[str], labelled: Labelled, precision: Mapping[str, float]
) -> dict[str, Abstention]:
    """The threshold for each type ``precision`` asks of, on confidences held out by folds."""
    rows = rows_by_name(types)
    fitted = {}
    for kind, asked in precision.items():
        ours = labelled.rows(rows.get(kind, []))
        try:
            held_out = cross_validated_probabilities(ours)
        except ValueError:  # too few answers or groups to hold any out: abstain always
            held_out, ours = [], Labelled([], [], [])
        tops, hits = top_and_hits(held_out, ours.correct)
        fitted[kind] = fit_abstention(tops, hits, ours.groups, asked)
    return fitted


def held_out_threshold(
    log_probabilities: FloatArray, labelled: Labelled, precision: float
) -> Abstention:
    """One question's threshold from its labels' held-out log-probabilities (the top option answers)."""
    probabilities = np.exp(log_probabilities)
    hits = probabilities.argmax(axis=1) == np.asarray(labelled.correct)
    return fit_abstention(
        probabilities.max(axis=1).tolist(), hits.tolist(), labelled.groups, precision
    ).model_copy(update={"scope": "question"})


def question_thresholds(
    keys: Sequence[str],
    labelled: Labelled,
    scales: Sequence[float],
    kept: Collection[str],
    precision: Mapping[str, float],
) -> dict[str, Abstention]:
    """The threshold for each question ``precision`` asks of, on its own labels scored as it is served
    (by its own map fitted on the other folds where ``kept``)."""
    rows = rows_by_name(keys)
    fitted = {}
    for key, asked in precision.items():
        picked = rows.get(key, [])
        ours = labelled.rows(picked)
        if len(set(ours.groups)) < 2:
            fitted[key] = abstains(
                asked,
                len(picked),
                len(set(ours.groups)),
                "the question's labels come from fewer than two groups, so none can be held "
                "out to fit a threshold on",
            ).model_copy(update={"scope": "question"})
            continue
        own, typed = held_out(ours, scales[picked[0]])
        fitted[key] = held_out_threshold(own if key in kept else typed, ours, asked)
    return fitted
