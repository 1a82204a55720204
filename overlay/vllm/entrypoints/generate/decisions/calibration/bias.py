# SPDX-License-Identifier: Apache-2.0
"""Which prior correction (prior.py) each question type gets: each one's T (and bias per position) is
fitted under group-disjoint cross-validation and kept as a temperature is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vllm.entrypoints.generate.decisions.calibration.in_force import (
    SCORE_FLOOR,
    SINGLE,
    Candidate,
    ReadChoice,
    TypeReads,
    keeps,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    fold_of_groups,
    gain_interval,
    newton_minimum,
)
from vllm.entrypoints.generate.decisions.decide.scoring import adjusted
from vllm.entrypoints.generate.decisions.decide.settings import (
    MODES,
    uses_content_free,
    uses_fitted,
)

FloatArray = npt.NDArray[np.float64]

# On the position intercepts, so a position seen a few times gets a small bias.
RIDGE = 0.1


@dataclass(frozen=True)
class Sample:
    """One calibration question as read (``priors``: its content-free reads, if read)."""

    rows: list[list[float]]
    positions: list[list[int]]
    priors: list[list[float]] | None
    correct: int
    group: str
    # Names the question across layouts (its id in the question file), so their losses can be paired.
    id: str = ""


def gain_over(
    candidate: Candidate, baseline: Candidate, groups: dict[str, str]
) -> tuple[float, float]:
    """``candidate``'s held-out log-loss gain interval over ``baseline`` on questions both answered."""
    shared = [key for key in candidate._losses if key in baseline._losses]
    return gain_interval(
        [baseline._losses[k] - candidate._losses[k] for k in shared],
        [groups[k] for k in shared],
    )


def features(sample: Sample, mode: str, width: int) -> tuple[FloatArray, FloatArray]:
    """The scores under ``mode``'s content-free part, and each option's positions 1..width-1."""
    scores = np.maximum(np.asarray(corrected(sample, mode, None)), SCORE_FLOOR)
    shares = np.zeros((len(scores), max(width - 1, 0)))
    for positions in sample.positions:
        for option, position in enumerate(positions):
            if 1 <= position < width:
                shares[option, position - 1] += 1.0 / len(sample.positions)
    return scores, shares


def _design(
    samples: Sequence[Sample], mode: str, width: int
) -> list[tuple[FloatArray, int, float]]:
    """Each sample's features, correct option and weight: with a bias to fit, each position holding the
    correct answer weighs alike, so the bias is the model's lean, not the set's answer mix."""
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


def corrected(sample: Sample, mode: str, bias: Sequence[float] | None) -> list[float]:
    """The sample's scores as a server answering with ``mode`` (and this bias) would give them."""
    priors = sample.priors if uses_content_free(mode) else None
    return adjusted(
        sample.rows, sample.positions, priors, bias if uses_fitted(mode) else None
    )


def choose(samples: Sequence[Sample], forced: str | None = None) -> ReadChoice:
    """The best correction (``forced``: the operator's), and every correction's figures."""
    width = max(len(s.rows[0]) for s in samples)
    have_priors = all(s.priors is not None for s in samples)
    modes = [m for m in MODES if have_priors or not uses_content_free(m)]
    names = [s.id or f"#{i}" for i, s in enumerate(samples)]
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
            candidate.gain = gain_over(candidate, off, groups)
    helping = [m for m, c in candidates.items() if c.beats(off)]
    chosen = min(helping, key=lambda m: candidates[m].log_loss, default="off")
    if forced is not None and forced in candidates:
        chosen = forced
    return ReadChoice(
        mode=chosen, candidates=candidates, forced=forced is not None, groups=groups
    )


def choose_layout(choices: dict[str | None, ReadChoice]) -> TypeReads:
    """The layout a type is read in: another than the first is kept as a correction is."""
    layouts = list(choices)
    first = choices[layouts[0]]
    baseline = first.candidates["off"]
    helping = []
    for layout in layouts[1:]:
        kept = choices[layout].kept
        gain = gain_over(kept, baseline, {**first.groups, **choices[layout].groups})
        better = kept.log_loss < first.kept.log_loss
        if better and keeps(gain, kept.accuracy, baseline.accuracy):
            helping.append(layout)
    chosen = min(
        helping, key=lambda layout: choices[layout].kept.log_loss, default=layouts[0]
    )
    by_layout = {layout or SINGLE: choice for layout, choice in choices.items()}
    return TypeReads(layout=chosen, by_layout=by_layout)
