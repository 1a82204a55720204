# SPDX-License-Identifier: Apache-2.0
"""Which prior correction each question type gets (prior.py), chosen on the calibration set.

For every type, each correction is tried under group-disjoint cross-validation: on the training folds
the temperature (and, for the fitted modes, an additive bias per option position) is fitted by
log-likelihood, and the held-out folds are scored by log loss and accuracy. A correction is kept only
when its gain is clearly real, as a temperature is: the 95% interval of its held-out log-loss gain over
the uncorrected reading (resampling question groups) lies above zero, and its accuracy is not lower;
the best kept one by log loss is the type's ``auto``. The fit is a multinomial logistic regression with one slope (1/T) on
the reading's scores and one intercept per position (position 0 fixed at 0, the shift softmax ignores),
solved by Newton's method with a small ridge on the intercepts, each position holding the correct answer
weighted alike (so the bias is the model's lean, not the set's answer mix). Pure functions: testable
without an engine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field, PrivateAttr

from vllm.entrypoints.generate.decisions.decide.calibration.maths import (
    FOLDS,
    RESAMPLES,
    fold_of_groups,
    newton_minimum,
)
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    MODES,
    uses_content_free,
    uses_fitted,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.scoring import (
    adjusted,
)

FloatArray = npt.NDArray[np.float64]

RIDGE = (
    0.1  # on the position intercepts, so a position seen a few times gets a small bias
)
# a -inf score (an option the reading gives nothing) enters the fit here
SCORE_FLOOR = -30.0


@dataclass(frozen=True)
class Sample:
    """One calibration question as read: each reading's log-probabilities and the position each option
    had (client order), the content-free log-probabilities when read, and the correct option."""

    rows: list[list[float]]
    positions: list[list[int]]
    priors: list[list[float]] | None
    correct: int
    group: str
    # Names the question across layouts (its id in the question file), so their losses can be paired.
    id: str = ""


class Candidate(BaseModel):
    """A correction's held-out log loss and accuracy, the 95% interval of its held-out log-loss gain over
    the baseline it was judged against (None for the baseline itself), and the T (and, fitted modes,
    the bias per position in score units) fitted for it on every question."""

    log_loss: float
    accuracy: float
    temperature: float
    bias: list[float] | None = None
    gain: tuple[float, float] | None = None
    # Each question's held-out loss by its id, for pairing (not saved).
    _losses: dict[str, float] = PrivateAttr(default_factory=dict)

    def gain_over(
        self, baseline: Candidate, groups: dict[str, str]
    ) -> tuple[float, float]:
        """The 95% interval of the mean held-out log-loss gain over ``baseline`` on the questions both
        answered."""
        shared = [key for key in self._losses if key in baseline._losses]
        return gain_interval(
            [baseline._losses[k] - self._losses[k] for k in shared],
            [groups[k] for k in shared],
        )

    def beats(self, baseline: Candidate) -> bool:
        """The keep rule: a gain whose whole interval is above zero, and no lower accuracy."""
        return (
            self.gain is not None
            and self.gain[0] > 0
            and self.accuracy >= baseline.accuracy
        )


def gain_interval(
    gains: Sequence[float],
    groups: Sequence[str],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """95% interval (2.5th and 97.5th percentiles) of the mean per-question gain, resampling question
    groups with replacement as the temperature's keep rule does (maths.bootstrap_interval)."""
    number: dict[str, int] = {}
    index = np.asarray(
        [number.setdefault(g, len(number)) for g in groups], dtype=np.int64
    )
    count = len(number)
    totals = np.bincount(
        index, weights=np.asarray(gains, dtype=np.float64), minlength=count
    )
    sizes = np.bincount(index, minlength=count).astype(np.float64)
    rng = np.random.default_rng(seed)
    values = np.empty(resamples)
    for r in range(resamples):
        weight = np.bincount(
            rng.integers(0, count, size=count), minlength=count
        ).astype(np.float64)
        values[r] = weight @ totals / (weight @ sizes)
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


class ReadChoice(BaseModel):
    """A question type's chosen correction (``mode``) and every correction's figures, in one layout."""

    mode: str
    candidates: dict[str, Candidate]
    # Whether the mode is the operator's setting rather than the figures' choice.
    forced: bool = False
    # Each question's group by its id, for pairing with another layout (not saved).
    groups: dict[str, str] = Field(default_factory=dict, exclude=True)

    @property
    def kept(self) -> Candidate:
        return self.candidates[self.mode]

    def log_line(self, name: str) -> str:
        off = self.candidates["off"]
        figures = ", ".join(
            f"{m} {c.log_loss:.3f}/{c.accuracy:.3f}" for m, c in self.candidates.items()
        )
        if self.forced:
            verdict = f"{self.mode} as set"
        elif self.mode == "off":
            verdict = "no correction kept (none clearly beats the uncorrected reading)"
        else:
            kept = self.candidates[self.mode]
            low, high = kept.gain or (0.0, 0.0)
            verdict = (
                f"{self.mode} kept (held-out log loss {off.log_loss:.3f} -> {kept.log_loss:.3f}, gain 95% "
                f"[{low:.3f}, {high:.3f}], accuracy {off.accuracy:.3f} -> {kept.accuracy:.3f})"
            )
        return f"decision reads ({name}): {verdict}; log loss/accuracy: {figures}"


def features(sample: Sample, mode: str, width: int) -> tuple[FloatArray, FloatArray]:
    """The reading's scores under ``mode``'s content-free part, and each option's position share
    (readings averaged) over positions 1..width-1."""
    priors = sample.priors if uses_content_free(mode) else None
    scores = np.maximum(
        np.asarray(adjusted(sample.rows, sample.positions, priors, None)), SCORE_FLOOR
    )
    shares = np.zeros((len(scores), max(width - 1, 0)))
    for positions in sample.positions:
        for option, position in enumerate(positions):
            if 1 <= position < width:
                shares[option, position - 1] += 1.0 / len(sample.positions)
    return scores, shares


def _design(
    samples: Sequence[Sample], mode: str, width: int
) -> list[tuple[FloatArray, int, float]]:
    """Each sample's features, its correct option and its weight. With a bias to fit, the samples are
    weighted so that every position holding the correct answer counts alike: the bias then measures
    the model's lean by position, not how often the calibration set's answers sit there (a yes/no set
    that is 70% "no" must not teach every server to lean to "no")."""
    fitted = uses_fitted(mode)
    where = [s.positions[0][s.correct] for s in samples]
    counts = {position: where.count(position) for position in set(where)}
    rows = []
    for sample, position in zip(samples, where, strict=True):
        scores, shares = features(sample, mode, width if fitted else 1)
        weight = len(samples) / (len(counts) * counts[position]) if fitted else 1.0
        rows.append((np.column_stack([scores, shares]), sample.correct, weight))
    return rows


def _newton(design: list[tuple[FloatArray, int, float]], size: int) -> FloatArray:
    """The maximum-likelihood (slope, intercepts), ridge on the intercepts, slope within the T range."""
    penalty = np.full(size, RIDGE)
    penalty[0] = 0.0

    def objective(t: FloatArray) -> float:
        total = 0.5 * float(penalty @ (t * t))
        for z, answer, weight in design:
            logits = z @ t
            top = logits.max()
            total += weight * float(
                top + np.log(np.exp(logits - top).sum()) - logits[answer]
            )
        return total

    def derivatives(t: FloatArray) -> tuple[FloatArray, FloatArray]:
        gradient = penalty * t
        hessian = np.diag(penalty) + 1e-9 * np.eye(size)
        for z, answer, weight in design:
            logits = z @ t
            p = np.exp(logits - logits.max())
            p /= p.sum()
            gradient += weight * (z.T @ p - z[answer])
            hessian += weight * (z.T @ (np.diag(p) - np.outer(p, p)) @ z)
        return gradient, hessian

    start = np.zeros(size)
    start[0] = 1.0
    return newton_minimum(objective, derivatives, start, 1e-9)


def fit(
    samples: Sequence[Sample], mode: str, width: int
) -> tuple[float, list[float] | None]:
    """The temperature and (fitted modes) the bias per position, in score units, for ``mode``."""
    size = width if uses_fitted(mode) else 1
    theta = _newton(_design(samples, mode, width), size)
    slope = float(theta[0])
    bias = [0.0] + [float(w) / slope for w in theta[1:]] if uses_fitted(mode) else None
    return 1.0 / slope, bias


def held_out(
    samples: Sequence[Sample], mode: str, width: int, folds: int = FOLDS
) -> tuple[list[float], list[bool]]:
    """``mode``'s log loss and hit on each question (in order), fitted on the other folds."""
    fold = fold_of_groups([s.group for s in samples], folds)
    losses, hits = [0.0] * len(samples), [False] * len(samples)
    for f in sorted(set(fold)):
        train = [s for s, k in zip(samples, fold, strict=True) if k != f]
        temperature, bias = fit(train, mode, width)
        for i in (i for i, k in enumerate(fold) if k == f):
            scores = corrected(samples[i], mode, bias)
            logits = np.maximum(np.asarray(scores), SCORE_FLOOR) / temperature
            log_p = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            losses[i] = -float(log_p[samples[i].correct])
            hits[i] = int(np.argmax(logits)) == samples[i].correct
    return losses, hits


def keys(samples: Sequence[Sample]) -> list[str]:
    return [s.id or f"#{i}" for i, s in enumerate(samples)]


def corrected(sample: Sample, mode: str, bias: Sequence[float] | None) -> list[float]:
    """The sample's scores as a server answering with ``mode`` (and this bias) would give them."""
    priors = sample.priors if uses_content_free(mode) else None
    return adjusted(
        sample.rows, sample.positions, priors, bias if uses_fitted(mode) else None
    )


def choose(samples: Sequence[Sample], forced: str | None = None) -> ReadChoice:
    """The correction this type's questions are best answered with (``forced``: the one an operator
    set, whatever the figures say), and every correction's figures."""
    width = max(len(s.rows[0]) for s in samples)
    modes = [
        m
        for m in MODES
        if not uses_content_free(m) or all(s.priors is not None for s in samples)
    ]
    names = keys(samples)
    groups = dict(zip(names, (s.group for s in samples), strict=True))
    candidates: dict[str, Candidate] = {}
    for mode in modes:
        losses, hits = held_out(samples, mode, width)
        temperature, bias = fit(samples, mode, width)
        candidate = Candidate(
            log_loss=float(np.mean(losses)),
            accuracy=float(np.mean(hits)),
            temperature=temperature,
            bias=bias,
        )
        candidate._losses = dict(zip(names, losses, strict=True))
        candidates[mode] = candidate
    off = candidates["off"]
    for name, candidate in candidates.items():
        if name != "off":
            candidate.gain = candidate.gain_over(off, groups)
    helping: list[str] = [m for m, c in candidates.items() if c.beats(off)]
    chosen: str = (
        min(helping, key=lambda m: candidates[m].log_loss) if helping else "off"
    )
    if forced is not None and forced in candidates:
        chosen = forced
    return ReadChoice(
        mode=chosen, candidates=candidates, forced=forced is not None, groups=groups
    )


# The key of a backend's one way of reading, where it has no layouts to compare.
SINGLE = "single"


def question_key(question: CompiledQuestion) -> str:
    """Names a question alike in a calibration file and in requests: its type, criterion and options
    (sorted, so the order they are sent in doesn't matter)."""
    options = sorted([o.key, o.text] for o in question.options)
    return json.dumps(
        [question.qtype.name, question.instructions, options], ensure_ascii=False
    )


class TypeReads(BaseModel):
    """A question type's reads as calibration chose them: the label layout kept (None where the backend
    has one way) and, for each layout compared, the correction chosen in it with every one's figures;
    and, in the layout kept, a fitted bias of their own for questions the file labels many times
    (``questions``, by :func:`question_key`)."""

    layout: str | None = None
    by_layout: dict[str, ReadChoice]
    questions: dict[str, ReadChoice] = Field(default_factory=dict)

    def for_question(
        self, key: str | None, layout: str | None
    ) -> tuple[ReadChoice | None, bool]:
        """The choice a question read in ``layout`` gets, and whether it is the question's own."""
        own = (
            self.questions.get(key)
            if key is not None and layout == self.layout
            else None
        )
        return (own, True) if own is not None else (self.in_layout(layout), False)

    @property
    def chosen(self) -> ReadChoice:
        return self.by_layout[self.layout or SINGLE]

    def in_layout(self, layout: str | None) -> ReadChoice | None:
        return self.by_layout.get(layout or SINGLE)

    def log_lines(self, name: str) -> list[str]:
        own = [
            choice.log_line(f"{name}, {json.loads(key)[1]!r}")
            for key, choice in self.questions.items()
        ]
        if self.layout is None:
            return [self.chosen.log_line(name), *own]
        lines = [
            choice.log_line(f"{name}, {layout}")
            for layout, choice in self.by_layout.items()
        ]
        baseline = next(iter(self.by_layout))
        if self.layout == baseline:
            return [
                *lines,
                f"decision reads ({name}): {baseline} labels kept (no other layout did better)",
                *own,
            ]
        off, kept = self.by_layout[baseline].candidates["off"], self.chosen.kept
        return [
            *lines,
            (
                f"decision reads ({name}): {self.layout} labels kept (held-out log loss "
                f"{off.log_loss:.3f} -> {kept.log_loss:.3f}, accuracy {off.accuracy:.3f} -> {kept.accuracy:.3f} "
                f"against {baseline} without a correction)"
            ),
            *own,
        ]


def choose_layout(choices: dict[str | None, ReadChoice]) -> TypeReads:
    """The layout a type is read in: each layout's chosen correction against the first layout read
    without one; another layout is kept, as a correction is, only with a lower held-out log loss and no
    lower accuracy, the best of those by log loss."""
    layouts = list(choices)
    first = choices[layouts[0]]
    baseline = first.candidates["off"]
    helping = []
    for layout in layouts[1:]:
        kept = choices[layout].kept
        gain = kept.gain_over(baseline, {**first.groups, **choices[layout].groups})
        if (
            gain[0] > 0
            and kept.accuracy >= baseline.accuracy
            and kept.log_loss < first.kept.log_loss
        ):
            helping.append(layout)
    chosen = (
        min(helping, key=lambda layout: choices[layout].kept.log_loss)
        if helping
        else layouts[0]
    )
    by_layout = {layout or SINGLE: choice for layout, choice in choices.items()}
    return TypeReads(layout=chosen, by_layout=by_layout)


def choose_per_question(
    samples: Sequence[Sample], forced: str | None = None
) -> ReadChoice | None:
    """One question's own fitted bias, from its many labelled answers: kept where a fitted mode clearly
    beats reading it uncorrected (the type's keep rule); None otherwise, and the type's choice serves it.
    Under a mode set by the operator, that mode if it is a fitted one."""
    choice = choose(samples, forced)
    return choice if uses_fitted(choice.mode) else None
