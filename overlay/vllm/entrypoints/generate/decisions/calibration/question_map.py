# SPDX-License-Identifier: Apache-2.0
"""One question's own map, fitted on its labels: a small model's lean on one question is invisible in
its type's map and plain in twenty labels. Pulled toward the type's map, kept by its keep rule."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from vllm.entrypoints.generate.decisions.calibration.in_force import (
    QuestionMap,
    floored_scores,
    log_softmax_rows,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    Labelled,
    fold_of_groups,
    gain_interval,
    newton_minimum,
    rows_by_name,
)
from vllm.entrypoints.generate.decisions.decide.reports import MapFigures

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# A Gaussian prior around the type's map, set from what a label can say, not tuned on a file: a label
# carries about 0.2 units of information on each option's bias, so strength 1 (one nat's spread) lets
# 8 labels move a bias about 2/3 of the way to what they alone say, 20 about 5/6, hundreds all the way.
BIAS_PENALTY = 1.0
# Fewer labels and the type's reads serve. On synthetic labels with no lean the keep rule kept a map
# in 5% of trials at 8 labels, 2.5% at 12 and 1% at 20 (it aims for 2.5%).
MIN_LABELS = 8
# On scale / type scale (so the same at every T), where a label carries about the variance of the
# type's logits: the same 2/3-at-8-labels pull.
SCALE_PENALTY = 4.0


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
    """The type's map as (scale, centred bias), centred as softmax ignores a shift."""
    if not 1.0 / HIGH_TEMPERATURE <= scale <= 1.0 / LOW_TEMPERATURE:
        raise ValueError(
            f"the type's scale must lie in [{1.0 / HIGH_TEMPERATURE}, "
            f"{1.0 / LOW_TEMPERATURE}] (1/T), got {scale}"
        )
    centre = np.zeros(width) if bias is None else np.asarray(bias, dtype=np.float64)
    if centre.shape != (width,) or not np.isfinite(centre).all():
        raise ValueError(f"the type's bias needs {width} finite values")
    return scale, centre - centre.mean()


def _fit(
    matrix: FloatArray, answer: IntArray, scale: float, bias: FloatArray
) -> tuple[float, FloatArray]:
    """Newton on the penalised NLL, strictly convex as the penalty fixes the shift softmax ignores."""
    rows, width = matrix.shape
    picked = np.arange(rows)
    weights = np.concatenate([[SCALE_PENALTY / scale**2], np.full(width, BIAS_PENALTY)])
    centre = np.concatenate([[scale], bias])

    def objective(theta: FloatArray) -> float:
        log_p = log_softmax_rows(theta[0] * matrix + theta[1:])
        gap = theta - centre
        return float(-log_p[picked, answer].sum() + 0.5 * weights @ (gap * gap))

    def derivatives(theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        p = np.exp(log_softmax_rows(theta[0] * matrix + theta[1:]))
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
    """One question's (scale, centred bias), pulled toward the type's (``bias`` in logit units)."""
    matrix = floored_scores(scores)
    answer = _answers(correct, *matrix.shape)
    fitted_scale, fitted_bias = _fit(
        matrix, answer, *_type_map(scale, bias, matrix.shape[1])
    )
    return fitted_scale, fitted_bias.tolist()


def measure_question_map(
    labelled: Labelled,
    scale: float,
    bias: Sequence[float] | None = None,
    folds: int = FOLDS,
) -> QuestionMap:
    """The question's map fitted on every label, with its held-out figures and the type's map's."""
    own, typed = held_out(labelled, scale, bias, folds)
    final_scale, final_bias = fit_map(labelled.scores, labelled.correct, scale, bias)
    figures = compared(own, typed, labelled)
    return QuestionMap(**figures.model_dump(), scale=final_scale, bias=final_bias)


def compared(own: FloatArray, baseline: FloatArray, labelled: Labelled) -> MapFigures:
    """The held-out figures of ``own``'s log-probabilities against ``baseline``'s."""
    answer = np.asarray(labelled.correct, dtype=np.int64)
    rows = np.arange(answer.size)
    own_loss, base_loss = -own[rows, answer], -baseline[rows, answer]
    return MapFigures(
        labels=int(answer.size),
        log_loss=float(own_loss.mean()),
        accuracy=float((own.argmax(axis=1) == answer).mean()),
        type_log_loss=float(base_loss.mean()),
        type_accuracy=float((baseline.argmax(axis=1) == answer).mean()),
        gain=gain_interval((base_loss - own_loss).tolist(), list(labelled.groups)),
    )


def held_out(
    labelled: Labelled,
    scale: float,
    bias: Sequence[float] | None = None,
    folds: int = FOLDS,
) -> tuple[FloatArray, FloatArray]:
    """Each label's log-probabilities under its own map fitted on the other folds, and the type's."""
    matrix = floored_scores(labelled.scores)
    answer = _answers(labelled.correct, *matrix.shape)
    type_scale, type_bias = _type_map(scale, bias, matrix.shape[1])
    fold = np.asarray(fold_of_groups(labelled.groups, folds), dtype=np.int64)
    if np.unique(fold).size < 2:
        raise ValueError("cross-validation needs labels from at least two groups")
    typed = log_softmax_rows(type_scale * matrix + type_bias)
    own = np.empty_like(typed)
    for f in np.unique(fold):
        held = fold == f
        fitted_scale, fitted_bias = _fit(
            matrix[~held], answer[~held], type_scale, type_bias
        )
        own[held] = log_softmax_rows(fitted_scale * matrix[held] + fitted_bias)
    return own, typed


def choose_question_map(
    labelled: Labelled,
    scale: float,
    bias: Sequence[float] | None = None,
    folds: int = FOLDS,
) -> QuestionMap | None:
    """The question's own map where it is kept (labels from one group: None, nothing to hold out)."""
    if folds < 2 or len(set(labelled.groups)) < 2:
        return None
    measured = measure_question_map(labelled, scale, bias, folds)
    return measured if measured.kept else None


def question_maps(
    keys: Sequence[str],
    labelled: Labelled,
    scales: Sequence[float],
    minimum: int = MIN_LABELS,
) -> dict[str, QuestionMap]:
    """The kept map of every question labelled at least ``minimum`` times."""
    maps = {}
    for key, picked in rows_by_name(keys).items():
        if len(picked) < minimum:
            continue
        kept = choose_question_map(labelled.rows(picked), scales[picked[0]])
        if kept is not None:
            maps[key] = kept
    return maps
