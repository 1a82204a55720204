# SPDX-License-Identifier: Apache-2.0
"""One question's own calibration, fitted from an operator's few labels of it.

A type's reads give every question of the type one map from its scores to probabilities,
``softmax(scale * s + bias)``; a small model's lean on one particular question is invisible there
and plain in twenty labelled answers of it. So a labelled question gets an affine map of its own on
its (already corrected) option scores: one scale and one bias per option, fitted by penalised
maximum likelihood with the penalty pulling toward the type's map, so that a few labels move it a
little and many move it all the way. It is kept by the type's keep rule (grouped cross-validation,
the held-out log-loss gain's interval above zero, accuracy not lower); otherwise the type's map
serves the question. Pure functions over plain sequences: testable without an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from vllm.entrypoints.generate.decisions.decide.calibration.bias import (
    SCORE_FLOOR,
    Candidate,
    gain_interval,
)
from vllm.entrypoints.generate.decisions.decide.calibration.maths import (
    FOLDS,
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    fold_of_groups,
    newton_minimum,
)
from vllm.entrypoints.generate.decisions.decide.reports import (
    MapFigures,
    QuestionMapAudit,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The penalty is a Gaussian prior around the type's map, set from how much a label can say, not
# tuned on any labelled file. A label carries about p(1 - p) <= 0.25 units of information on each
# option's bias (near 0.2 for 2-5 options), so a prior of one nat's spread per bias (strength 1)
# lets 8 labels move the bias about two thirds of the way to what they alone say, 20 labels about
# five sixths, and hundreds all the way; a lean of one or two nats is what a small model shows on a
# question. The scale's prior has a spread of half the type's scale: on the relative scale
# ``scale / type scale`` a label carries about the variance of the type's logits (around one nat
# squared), so strength 4 there gives the scale the same two-thirds-at-8-labels behaviour.
BIAS_PENALTY = 1.0
# Fewer labels than this and a question keeps its type's reads. Over few groups the keep rule's
# interval is narrow: on synthetic labels that carry no lean it kept a map in 5% of trials at 8
# labels, 2.5% at 12 and 1% at 20 (against the 2.5% it aims for).
MIN_LABELS = 8
SCALE_PENALTY = 4.0  # on scale / type scale, so it means the same at every T


class QuestionMap(MapFigures):
    """A question's own map ``softmax(scale * s + bias)`` on its scores (options in the question's
    client order, ``bias`` in logit units and centred), with its figures (saved, so the audit can name
    them)."""

    scale: float
    bias: list[float]

    @property
    def kept(self) -> bool:
        """The type's keep rule (bias.Candidate.beats): the held-out gain's whole interval above
        zero, and no lower held-out accuracy than the type's map."""
        own = Candidate(
            log_loss=self.log_loss,
            accuracy=self.accuracy,
            temperature=1.0 / self.scale,
            gain=self.gain,
        )
        typed = Candidate(
            log_loss=self.type_log_loss,
            accuracy=self.type_accuracy,
            temperature=1.0,
        )
        return own.beats(typed)

    def audit(self, keys: Sequence[str]) -> QuestionMapAudit:
        """What an answer's ``extra.audit.question_map`` says of this map (``keys``: the options')."""
        figures = self.model_dump(include=set(MapFigures.model_fields))
        return QuestionMapAudit(**figures, bias=dict(zip(keys, self.bias, strict=True)))

    def log_line(self, name: str) -> str:
        """The line startup logs for a kept map; ``name`` says which question."""
        return (
            f"decision calibration ({name}): a map of its own kept from {self.labels} labels "
            f"(held-out log loss {self.type_log_loss:.3f} -> {self.log_loss:.3f}, accuracy "
            f"{self.type_accuracy:.3f} -> {self.accuracy:.3f}; gain interval "
            f"[{self.gain[0]:.3f}, {self.gain[1]:.3f}])"
        )

    def log_probabilities(self, scores: Sequence[float]) -> list[float]:
        """The question's log-probabilities for one read's scores; a ``-inf`` score enters at the
        floor it was fitted with (bias.SCORE_FLOOR), as it does in the type's fit."""
        row = _floored([scores], len(self.bias))[0]
        return _log_softmax(self.scale * row[None, :] + np.asarray(self.bias)[None, :])[
            0
        ].tolist()

    def probabilities(self, scores: Sequence[float]) -> list[float]:
        return np.exp(self.log_probabilities(scores)).tolist()


class LabelledRead(BaseModel):
    """One labelled input's read of one question, as a map is fitted on it: the corrected scores its
    type's T divides and ``1 / T``, the scale the map is pulled toward; and, for startup's reads
    (kept in the calibration record so a labels file's refit can pool with them), its answer and
    group. A labels file's reads take those from the file's current lines instead."""

    state_sha256: str
    question: str
    scores: list[float]
    scale: float
    correct: int | None = None
    group: str | None = None


def _floored(scores: Sequence[Sequence[float]], width: int | None = None) -> FloatArray:
    """The score lists as an (N, K) matrix, ``-inf`` raised to the floor; NaN and +inf refused."""
    if not scores:
        raise ValueError("no labelled answers to fit a question's map on")
    widths = {len(row) for row in scores}
    if len(widths) != 1 or (width is not None and widths != {width}):
        raise ValueError(
            "every score list of one question needs the same options"
            + (f" ({width})" if width is not None else "")
        )
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.shape[1] < 2:
        raise ValueError("a question's map needs at least two options")
    if np.isnan(matrix).any() or np.isposinf(matrix).any():
        raise ValueError("option scores must be finite or -inf")
    return np.maximum(matrix, SCORE_FLOOR)


def _answers(correct: Sequence[int], rows: int, width: int) -> IntArray:
    answer = np.asarray(correct, dtype=np.int64)
    if answer.shape != (rows,):
        raise ValueError(f"got {rows} score lists but {answer.size} correct indices")
    if (answer < 0).any() or (answer >= width).any():
        raise ValueError("a correct index is outside the question's options")
    return answer


def _type_map(
    scale: float, bias: Sequence[float] | None, width: int
) -> tuple[float, FloatArray]:
    """The type's map as (scale, centred bias); softmax ignores a shift, so centring changes no
    probability and makes the penalty's centre the one bias of its class that is centred."""
    if not 1.0 / HIGH_TEMPERATURE <= scale <= 1.0 / LOW_TEMPERATURE:
        raise ValueError(
            f"the type's scale must lie in [{1.0 / HIGH_TEMPERATURE}, "
            f"{1.0 / LOW_TEMPERATURE}] (1/T), got {scale}"
        )
    centre = np.zeros(width) if bias is None else np.asarray(bias, dtype=np.float64)
    if centre.shape != (width,) or not np.isfinite(centre).all():
        raise ValueError(f"the type's bias needs {width} finite values")
    return scale, centre - centre.mean()


def _log_softmax(logits: FloatArray) -> FloatArray:
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


def _fit(
    matrix: FloatArray, answer: IntArray, scale: float, bias: FloatArray
) -> tuple[float, FloatArray]:
    """Newton's method on the penalised negative log-likelihood in (scale, bias per option).

    The objective is convex (logits linear in the parameters, a quadratic penalty) and strictly so:
    the penalty fixes the one direction softmax ignores (a shift of every bias), at the centred
    solution, since the type's bias is centred. The scale stays within the temperature range."""
    rows, width = matrix.shape
    picked = np.arange(rows)
    weights = np.concatenate([[SCALE_PENALTY / scale**2], np.full(width, BIAS_PENALTY)])
    centre = np.concatenate([[scale], bias])

    def objective(theta: FloatArray) -> float:
        log_p = _log_softmax(theta[0] * matrix + theta[1:])
        gap = theta - centre
        return float(-log_p[picked, answer].sum() + 0.5 * weights @ (gap * gap))

    def derivatives(theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        p = np.exp(_log_softmax(theta[0] * matrix + theta[1:]))
        # each row's d(loss)/d(logits) is p - onehot, its curvature diag(p) - p p^T
        residual = p.copy()
        residual[picked, answer] -= 1.0
        gradient = np.concatenate(
            [[(residual * matrix).sum()], residual.sum(axis=0)]
        ) + weights * (theta - centre)
        mean_score = (p * matrix).sum(axis=1)
        hessian = np.empty((width + 1, width + 1))
        hessian[0, 0] = (p * matrix * matrix).sum() - (mean_score * mean_score).sum()
        cross = (p * matrix).sum(axis=0) - (p * mean_score[:, None]).sum(axis=0)
        hessian[0, 1:] = hessian[1:, 0] = cross
        hessian[1:, 1:] = np.diag(p.sum(axis=0)) - p.T @ p
        hessian += np.diag(weights)
        return gradient, hessian

    theta = newton_minimum(objective, derivatives, centre, 1e-10)
    return float(theta[0]), theta[1:] - theta[1:].mean()


def fit_map(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    scale: float,
    bias: Sequence[float] | None = None,
) -> tuple[float, list[float]]:
    """One question's (scale, centred bias per option) from its labelled answers' scores (options in
    its client order, already corrected as its type reads them; ``-inf`` allowed), pulled toward the
    type's map ``softmax(scale * s + bias)`` (``bias`` in logit units, None: none)."""
    matrix = _floored(scores)
    answer = _answers(correct, *matrix.shape)
    fitted_scale, fitted_bias = _fit(
        matrix, answer, *_type_map(scale, bias, matrix.shape[1])
    )
    return fitted_scale, fitted_bias.tolist()


def measure_question_map(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    scale: float,
    bias: Sequence[float] | None = None,
    folds: int = FOLDS,
) -> QuestionMap:
    """The question's map fitted on every label, with its held-out log loss and accuracy and the
    type's map's on the same answers: each fold is scored by a map fitted on the other folds
    (answers of one group share a fold), and the gain's interval resamples groups. Raises
    ValueError where the labels come from fewer than two groups (nothing to hold out)."""
    own, typed = held_out(scores, correct, groups, scale, bias, folds)
    final_scale, final_bias = fit_map(scores, correct, scale, bias)
    return QuestionMap(
        scale=final_scale,
        bias=final_bias,
        **compared(own, typed, correct, groups),
    )


def compared(
    own: FloatArray,
    baseline: FloatArray,
    correct: Sequence[int],
    groups: Sequence[str],
) -> dict[str, Any]:
    """MapFigures' held-out fields for ``own``'s log-probabilities against ``baseline``'s on the same
    labels: log loss and accuracy of each, and the gain's interval resampling groups."""
    answer = np.asarray(correct, dtype=np.int64)
    rows = np.arange(answer.size)
    own_loss, base_loss = -own[rows, answer], -baseline[rows, answer]
    return {
        "labels": int(answer.size),
        "log_loss": float(own_loss.mean()),
        "accuracy": float((own.argmax(axis=1) == answer).mean()),
        "type_log_loss": float(base_loss.mean()),
        "type_accuracy": float((baseline.argmax(axis=1) == answer).mean()),
        "gain": gain_interval((base_loss - own_loss).tolist(), list(groups)),
    }


def held_out(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    scale: float,
    bias: Sequence[float] | None = None,
    folds: int = FOLDS,
) -> tuple[FloatArray, FloatArray]:
    """Each label's log-probabilities under the question's own map fitted on the other folds (answers
    of one group share a fold, ``fold_of_groups``), and under the type's map. Raises ValueError where
    the labels come from fewer than two groups (nothing to hold out)."""
    matrix = _floored(scores)
    answer = _answers(correct, *matrix.shape)
    if len(groups) != answer.size:
        raise ValueError(f"got {answer.size} labelled answers but {len(groups)} groups")
    type_scale, type_bias = _type_map(scale, bias, matrix.shape[1])
    fold = np.asarray(fold_of_groups(groups, folds), dtype=np.int64)
    if np.unique(fold).size < 2:
        raise ValueError("cross-validation needs labels from at least two groups")
    typed = _log_softmax(type_scale * matrix + type_bias)
    own = np.empty_like(typed)
    for f in np.unique(fold):
        held = fold == f
        fitted_scale, fitted_bias = _fit(
            matrix[~held], answer[~held], type_scale, type_bias
        )
        own[held] = _log_softmax(fitted_scale * matrix[held] + fitted_bias)
    return own, typed


def choose_question_map(
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    scale: float,
    bias: Sequence[float] | None = None,
    folds: int = FOLDS,
) -> QuestionMap | None:
    """The question's own map where it clearly beats the type's (:attr:`QuestionMap.kept`); None
    otherwise, and the type's reads serve the question. Labels from a single group are None too:
    with nothing to hold out, no gain can be shown."""
    if len(set(groups)) < 2 or min(folds, len(set(groups))) < 2:
        return None
    measured = measure_question_map(scores, correct, groups, scale, bias, folds)
    return measured if measured.kept else None


def question_maps(
    keys: Sequence[str],
    scores: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    scales: Sequence[float],
    minimum: int = MIN_LABELS,
) -> dict[str, QuestionMap]:
    """The kept map of every question labelled at least ``minimum`` times, by its key: answer ``i``
    is of the question ``keys[i]``, whose type's map has scale ``scales[i]``."""
    rows: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        rows.setdefault(key, []).append(index)
    maps = {}
    for key, picked in rows.items():
        if len(picked) < minimum:
            continue
        kept = choose_question_map(
            [scores[i] for i in picked],
            [correct[i] for i in picked],
            [groups[i] for i in picked],
            scales[picked[0]],
        )
        if kept is not None:
            maps[key] = kept
    return maps
