# SPDX-License-Identifier: Apache-2.0
"""Answers that know when to abstain: the confidence threshold that reaches an operator's precision.

An operator asks for a precision (say 0.9: nine answers in ten right among those the server stands
by). From held-out labelled answers (each scored by a calibration that never saw its label) this fits
the lowest threshold on an answer's calibrated confidence whose precision is still at least that on
inputs the fit never saw, not merely on the labels; an answer then clears it or abstains. The record
says what was asked, what was fitted and on how much, and, when no threshold can be trusted to reach
the precision, that every answer abstains and why. Pure functions: testable without an engine.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from vllm.entrypoints.generate.decisions.decide.calibration.maths import (
    RESAMPLES,
    BoolArray,
    FloatArray,
    IntArray,
    cross_validated_probabilities,
)
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    held_out,
)
from vllm.entrypoints.generate.decisions.decide.reports import AbstentionReport

# Fewer answered labels than this and a precision says too little, whatever its bound: the binomial
# bound's normal approximation and the bootstrap both need a few dozen answers to mean anything.
MIN_ANSWERED = 20
# Thresholds tried at most: the distinct confidences, thinned to this many quantiles of them beyond it,
# so a large label file costs a bounded (groups x thresholds) matrix.
MAX_THRESHOLDS = 256
# Both bounds are one-sided 95% lower bounds: the claim is one-sided (precision at least the asked), so
# about 19 fits in 20 reach it on new inputs. The two-sided interval's lower end (97.5%, as the keep rules
# use) abstained in over half of the 300-label fits at 0.9 in the tests' synthetic model, for no gain.
Z = 1.6448536269514722
LOWER_PERCENTILE = 5.0
# Bootstrap weights per chunk (resamples x groups), to keep memory flat for large label files.
CHUNK_CELLS = 2_000_000

Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class Abstention(BaseModel):
    """One fitted abstention rule: an answer whose calibrated confidence is at least ``threshold``
    clears it; every other answer abstains (all of them when ``threshold`` is None, ``reason`` says
    why). Figures are on the held-out labels the rule was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    precision_asked: float = Field(gt=0.0, lt=1.0, allow_inf_nan=False)
    threshold: Share | None
    # Among the held-out answers that clear the threshold: their precision and its lower bound.
    precision_reached: Share | None
    precision_bound: Share | None
    # The share of held-out answers that clear the threshold (0 when every answer abstains).
    coverage: Share
    answered: int = Field(ge=0)
    labels: int = Field(ge=0)
    groups: int = Field(ge=0)
    reason: str | None = None
    # Whom it was fitted for: a question type's answers, or one question's the operator's file names.
    scope: Literal["type", "question"] = "type"

    @property
    def abstains_always(self) -> bool:
        return self.threshold is None

    def clears(self, confidence: float) -> bool:
        """Whether an answer with this calibrated confidence is given (True) or abstains (False)."""
        return self.threshold is not None and confidence >= self.threshold

    def log_line(self, name: str, source: str = "decision calibration") -> str:
        """The line ``source`` logs for ``name``'s threshold (a type's, or a question's)."""
        if self.threshold is None:
            return f"{source} ({name}): every answer abstains: {self.reason}"
        return (
            f"{source} ({name}): precision {self.precision_asked:g} above confidence "
            f"{self.threshold:.3f} (held-out precision {self.precision_reached:.3f}, lower bound "
            f"{self.precision_bound:.3f}; {self.coverage:.0%} of {self.labels} labelled answers answered)"
        )

    def report(self, confidence: float) -> AbstentionReport:
        """What an answer with this calibrated confidence says in ``extra.abstention``."""
        return AbstentionReport(
            abstain=not self.clears(confidence),
            precision=self.precision_asked,
            threshold=self.threshold,
            precision_reached=self.precision_reached,
            coverage=self.coverage,
            labels=self.labels,
            reason=self.reason,
            scope=self.scope,
        )


def abstains(precision: float, labels: int, groups: int, reason: str) -> Abstention:
    """The rule under which every answer abstains, and why."""
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
    """The one-sided 95% Wilson score lower bound of ``hits / answered`` (0 where none answered).

    Unlike the bootstrap it stays below 1 when every answer is right: 30 of 30 gives 0.917.
    """
    n = np.maximum(answered, 1.0)
    share = hits / n
    z2 = Z * Z
    centre = share + z2 / (2 * n)
    spread = Z * np.sqrt(share * (1 - share) / n + z2 / (4 * n * n))
    return np.where(answered > 0, (centre - spread) / (1 + z2 / n), 0.0)


def _candidates(confidence: FloatArray) -> FloatArray:
    """The thresholds tried, ascending: every distinct confidence, or as many quantiles (each one a
    confidence seen) when there are more than :data:`MAX_THRESHOLDS`."""
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
    """(groups x thresholds) matrices: how many of each group's answers clear each threshold, and how
    many of those are right. An answer clears every threshold up to its own confidence, so a count at
    its highest one, summed from the top down, gives all of them at once."""
    highest = np.searchsorted(thresholds, confidence, side="right") - 1
    answered = np.zeros((count, thresholds.size))
    right = np.zeros((count, thresholds.size))
    clears_any = highest >= 0
    np.add.at(answered, (group[clears_any], highest[clears_any]), 1.0)
    np.add.at(right, (group[clears_any], highest[clears_any]), hit[clears_any])
    return (
        np.cumsum(answered[:, ::-1], axis=1)[:, ::-1],
        np.cumsum(right[:, ::-1], axis=1)[:, ::-1],
    )


def grouped_lower(
    answered: FloatArray, right: FloatArray, resamples: int, seed: int
) -> FloatArray:
    """Per threshold, the 5th percentile of precision over resamples of whole groups (with
    replacement, as many as there are). A resample in which nothing clears the threshold counts as
    precision 0: a threshold that only a few groups reach is not evidence of anything."""
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


def _checked(
    confidences: Sequence[float],
    correct: Sequence[bool],
    groups: Sequence[str],
    precision: float,
    resamples: int,
    min_answered: int,
) -> tuple[FloatArray, BoolArray, IntArray, int]:
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
    if (
        not np.isfinite(confidence).all()
        or ((confidence < 0.0) | (confidence > 1.0)).any()
    ):
        raise ValueError("confidences must be probabilities in [0, 1]")
    number: dict[str, int] = {}
    group = np.asarray(
        [number.setdefault(g, len(number)) for g in groups], dtype=np.int64
    )
    return confidence, hit, group, len(number)


def fit_abstention(
    confidences: Sequence[float],
    correct: Sequence[bool],
    groups: Sequence[str],
    precision: float,
    resamples: int = RESAMPLES,
    seed: int = 0,
    min_answered: int = MIN_ANSWERED,
) -> Abstention:
    """The lowest threshold on held-out calibrated confidence at which the precision of the answers
    that clear it is reliably at least ``precision``, or a record that every answer abstains.

    ``confidences`` are the held-out probabilities of the answers given (the top option's, or for
    yes/no the probability of the answer given), ``correct`` whether each was right, ``groups`` the
    question group of each (answers in a group are not independent evidence).

    A threshold qualifies when at least ``min_answered`` labels clear it and the lower bound of their
    precision is at least the precision asked; the lowest qualifying one answers the most. The bound
    is the lower of two one-sided 95% bounds, each covering the other's blind spot: the Wilson score
    bound treats answers as independent, which overstates the evidence when a group's answers succeed
    or fail together; the grouped bootstrap (resampling groups, as the keep rules do) sees that, but
    collapses to 1 when every answer it resamples is right. Taking the lowest threshold whose bound
    clears, rather than the lowest whose observed precision does, leaves room for the optimism of
    choosing among many thresholds on the same labels. On the tests' two synthetic models (300
    labels, asked 0.8 and 0.9, 40 seeds each: 160 fits) the observed-precision rule reached the
    asked precision on 20,000 fresh answers in 84 fits, falling to 0.734 for an asked 0.8; this rule
    in 153, at worst 0.009 below, answering a median 43-87% of inputs instead of 65-99%.
    """
    confidence, hit, group, count = _checked(
        confidences, correct, groups, precision, resamples, min_answered
    )
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
    types: Sequence[str],
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    precision: Mapping[str, float],
) -> dict[str, Abstention]:
    """The threshold for each question type ``precision`` asks a precision of (answer ``i`` is of type
    ``types[i]``), fitted on the type's held-out calibrated confidences: each answer scored by a T
    fitted on the other folds (maths.cross_validated_probabilities), so none saw its own label."""
    fitted = {}
    for kind, asked in precision.items():
        rows = [i for i, t in enumerate(types) if t == kind]
        kept = [groups[i] for i in rows]
        try:
            held_out = cross_validated_probabilities(
                [scores[i] for i in rows], [correct[i] for i in rows], kept
            )
        except ValueError:  # too few answers or groups to hold any out: abstain always
            held_out = []
            kept = []
        confidences = [max(row) for row in held_out]
        right = [
            int(np.argmax(row)) == correct[i]
            for row, i in zip(held_out, rows, strict=False)
        ]
        fitted[kind] = fit_abstention(confidences, right, kept, asked)
    return fitted


def held_out_threshold(
    log_probabilities: FloatArray,
    correct: Sequence[int],
    groups: Sequence[str],
    precision: float,
) -> Abstention:
    """The threshold for one question (scope ``question``) from its labels' held-out
    log-probabilities (one row per label, options in its order): the answer is each row's top
    option, its confidence that option's probability."""
    probabilities = np.exp(log_probabilities)
    hits = probabilities.argmax(axis=1) == np.asarray(correct)
    rule = fit_abstention(
        probabilities.max(axis=1).tolist(), hits.tolist(), groups, precision
    )
    return rule.model_copy(update={"scope": "question"})


def question_thresholds(
    keys: Sequence[str],
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    scales: Sequence[float],
    kept: Collection[str],
    precision: Mapping[str, float],
) -> dict[str, Abstention]:
    """The threshold for each question ``precision`` asks a precision of (by key; answer ``i`` is of
    the question ``keys[i]``, its type's map of scale ``scales[i]``), fitted on that question's own
    labels alone: the precision is asked of it, so other questions' answers are no evidence. Each
    label is scored as the question is served: by its own map fitted on the other folds where its
    map was ``kept``, else by its type's map."""
    rows: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        rows.setdefault(key, []).append(index)
    fitted = {}
    for key, asked in precision.items():
        picked = rows.get(key, [])
        labelled = [groups[i] for i in picked]
        answers = [correct[i] for i in picked]
        if len(set(labelled)) < 2:
            fitted[key] = abstains(
                asked,
                len(picked),
                len(set(labelled)),
                "the question's labels come from fewer than two groups, so none can be held "
                "out to fit a threshold on",
            ).model_copy(update={"scope": "question"})
            continue
        own, typed = held_out(
            [scores[i] for i in picked], answers, labelled, scales[picked[0]]
        )
        fitted[key] = held_out_threshold(
            own if key in kept else typed, answers, labelled, asked
        )
    return fitted
