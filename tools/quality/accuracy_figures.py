"""The figures and the table of tools/quality/accuracy.py: accuracy against the majority baseline, log loss,
Brier, ECE raw and calibrated (and the ECE a calibrated model would show on as many answers), each
question's most-picked share, collapsed questions, cost; and batch calibration, computed from another
row's answers."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm.entrypoints.generate.decisions.calibration import maths, question_file
from vllm.entrypoints.generate.decisions.decide.questions import top_index
from vllm.entrypoints.generate.decisions.decide.scoring import (
    log_softmax,
    softmax,
)

LOG_FLOOR = -100.0  # batch calibration: log-probabilities below this count as this
COLLAPSE_SHARE = 0.8
COLLAPSE_ACCURACY = 0.5
# Perfectly calibrated answer sets drawn for each ECE floor.
FLOOR_DRAWS = 400


@dataclass
class Reading:
    """One answer: option scores (log-probabilities, up to a constant) in the question's option order,
    the T the server applied to them, and the request's wall time; or the error that replaced it."""

    scores: list[float]
    temperature: float = 1.0
    seconds: float = 0.0
    error: str | None = None
    # the answer's extra.abstention.abstain, where it has one
    abstained: bool | None = None


def question_id(item: question_file.LabelledQuestion) -> str:
    """What makes two lines the same question: the question's JSON (its input aside)."""
    return json.dumps(item.raw, sort_keys=True, ensure_ascii=False)


def batch_calibrated(
    items: list[question_file.LabelledQuestion], readings: list[Reading]
) -> list[Reading]:
    """Each answer's log-softmax minus the mean log-softmax of all the answers to its question."""
    logs = [
        [max(s, LOG_FLOOR) for s in log_softmax(r.scores)] if not r.error else []
        for r in readings
    ]
    by_question: dict[str, list[list[float]]] = defaultdict(list)
    for item, log in zip(items, logs, strict=True):
        if log:
            by_question[question_id(item)].append(log)
    means = {
        q: [sum(column) / len(column) for column in zip(*rows, strict=True)]
        for q, rows in by_question.items()
    }
    out = []
    for item, log, reading in zip(items, logs, readings, strict=True):
        if reading.error:
            out.append(reading)
            continue
        mean = means[question_id(item)]
        out.append(
            Reading(
                [x - m for x, m in zip(log, mean, strict=True)],
                reading.temperature,
                reading.seconds,
            )
        )
    return out


# --- metrics ----------------------------------------------------------------------------------


def brier(probabilities: list[list[float]], correct: list[int]) -> float:
    return sum(
        sum((p - (j == c)) ** 2 for j, p in enumerate(row))
        for row, c in zip(probabilities, correct, strict=True)
    ) / len(correct)


def calibration_error(
    probabilities: list[list[float]], hits: list[bool], groups: list[str], seed: int
) -> tuple[float, tuple[float, float]]:
    top = [max(row) for row in probabilities]
    return maths.ece(top, hits), maths.bootstrap_interval(top, hits, groups, seed=seed)


def ece_floor(top: list[float], seed: int, draws: int = FLOOR_DRAWS) -> float:
    """The ECE a perfectly calibrated model would show, on average, with these top probabilities on
    this many answers: each answer drawn right with its own top probability, ``draws`` times. An ECE
    near it is sampling noise; a goal below it can't be shown on a set this size."""
    rng = np.random.default_rng(seed)
    confidence = np.asarray(top, dtype=float)
    return float(
        np.mean(
            [
                maths.ece(confidence, rng.random(confidence.size) < confidence)
                for _ in range(draws)
            ]
        )
    )


def per_question(
    questions: list[str], correct: list[int], picked: list[int]
) -> dict[str, Any]:
    """Majority baseline, mean accuracy over distinct questions, top share and collapsed questions."""
    answers: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for q, c, p in zip(questions, correct, picked, strict=True):
        answers[q].append((c, p))
    majority = sum(
        Counter(c for c, _ in pairs).most_common(1)[0][1] for pairs in answers.values()
    )
    accuracy = {
        q: sum(c == p for c, p in pairs) / len(pairs) for q, pairs in answers.items()
    }
    repeated = {q: pairs for q, pairs in answers.items() if len(pairs) >= 2}
    share = {
        q: Counter(p for _, p in pairs).most_common(1)[0][1] / len(pairs)
        for q, pairs in repeated.items()
    }
    collapsed = [
        q
        for q in repeated
        if share[q] > COLLAPSE_SHARE and accuracy[q] < COLLAPSE_ACCURACY
    ]
    return {
        "majority_baseline": majority / len(questions),
        "distinct_questions": len(answers),
        "mean_accuracy_per_question": sum(accuracy.values()) / len(accuracy),
        "repeated_questions": len(repeated),
        "top_share": sum(share.values()) / len(share) if share else None,
        "collapsed": len(collapsed),
    }


def metrics(
    items: list[question_file.LabelledQuestion], readings: list[Reading], seed: int
) -> dict[str, Any]:
    """The figures over the answered ones of ``items``."""
    answered = [
        (item, r) for item, r in zip(items, readings, strict=True) if not r.error
    ]
    if not answered:
        return {"questions": 0, "failed": len(items)}
    correct = [item.correct for item, _ in answered]
    groups = [item.group for item, _ in answered]
    raw = [softmax(r.scores) for _, r in answered]
    served = [softmax(r.scores, r.temperature) for _, r in answered]
    picked = [top_index(p) for p in served]
    hits = [p == c for p, c in zip(picked, correct, strict=True)]
    top = [max(p) for p in served]
    scaled = [[s / r.temperature for s in r.scores] for _, r in answered]
    seconds = sum(r.seconds for r in readings) / len(readings)
    return {
        "questions": len(answered),
        "failed": len(items) - len(answered),
        "accuracy": sum(hits) / len(hits),
        # beside accuracy it says which way ECE errs: under it, the answers are underconfident
        "mean_confidence": sum(top) / len(top),
        **per_question([question_id(item) for item, _ in answered], correct, picked),
        "log_loss": maths.nll(scaled, correct, 1.0),
        "log_loss_raw": maths.nll([r.scores for _, r in answered], correct, 1.0),
        "brier": brier(served, correct),
        "brier_raw": brier(raw, correct),
        "ece_raw": calibration_error(raw, hits, groups, seed),
        "ece_calibrated": calibration_error(served, hits, groups, seed),
        "ece_floor": ece_floor(top, seed),
        **abstention([r.abstained for _, r in answered], hits),
        "seconds_per_decision": seconds,
    }


def abstention(abstained: list[bool | None], hits: list[bool]) -> dict[str, Any]:
    """The share of answers that abstained and the accuracy of the others, where the server said
    (``extra.abstention``, an operator's VLLM_TYPED_DECISIONS_PRECISION); nothing where it didn't."""
    said = [(a, h) for a, h in zip(abstained, hits, strict=True) if a is not None]
    if not said:
        return {}
    answered = [h for a, h in said if not a]
    return {
        "abstention_rate": 1 - len(answered) / len(said),
        "precision_reached": sum(answered) / len(answered) if answered else None,
    }


def row_metrics(
    items: list[question_file.LabelledQuestion], readings: list[Reading], seed: int
) -> dict[str, Any]:
    """``metrics`` overall (``all``) and per question type."""
    kinds = sorted({item.question.qtype.name for item in items})
    out = {"all": metrics(items, readings, seed)}
    for kind in kinds:
        chosen = [i for i, item in enumerate(items) if item.question.qtype.name == kind]
        out[kind] = metrics(
            [items[i] for i in chosen], [readings[i] for i in chosen], seed
        )
    return out


def first_errors(readings: list[Reading], count: int = 3) -> list[str]:
    return list(dict.fromkeys(r.error for r in readings if r.error))[:count]


# --- output -----------------------------------------------------------------------------------

COLUMNS = [
    "row",
    "type",
    "n",
    "accuracy",
    "confidence",
    "majority",
    "mean acc/q",
    "log loss",
    "Brier",
    "ECE raw [95%]",
    "ECE calibrated [95%]",
    "top share",
    "collapsed",
    "abstains",
    "precision",
    "s/decision",
    "ratio",
]


def ece_cell(value: tuple[float, tuple[float, float]]) -> str:
    return f"{value[0]:.3f} [{value[1][0]:.2f}, {value[1][1]:.2f}]"


def table_line(
    row: str, kind: str, m: dict[str, Any], base: dict[str, Any] | None
) -> str:
    if not m["questions"]:
        return f"| {row} | {kind} | 0 | (every answer failed) |"
    seconds = m["seconds_per_decision"]
    ratio = (
        f"{seconds / base['seconds_per_decision']:.2f}x"
        if base and base.get("seconds_per_decision")
        else "-"
    )
    share = "-" if m["top_share"] is None else f"{m['top_share']:.2f}"
    abstains = m.get("abstention_rate")
    precision = m.get("precision_reached")
    cells = [
        row,
        kind,
        str(m["questions"]),
        f"{m['accuracy']:.3f}",
        f"{m['mean_confidence']:.3f}",
        f"{m['majority_baseline']:.3f}",
        f"{m['mean_accuracy_per_question']:.3f}",
        f"{m['log_loss']:.3f}",
        f"{m['brier']:.3f}",
        ece_cell(m["ece_raw"]),
        ece_cell(m["ece_calibrated"]),
        share,
        str(m["collapsed"]),
        "-" if abstains is None else f"{abstains:.2f}",
        "-" if precision is None else f"{precision:.3f}",
        f"{seconds:.3f}",
        ratio,
    ]
    return "| " + " | ".join(cells) + " |"


def table(results: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    measured = [r for r in results["rows"].values() if "metrics" in r]
    base = measured[0]["metrics"] if measured else {}
    notes = []
    for name, row in results["rows"].items():
        if "unavailable" in row:
            notes.append(f"{name}: unavailable ({row['unavailable']})")
            continue
        for kind, m in row["metrics"].items():
            lines.append(
                table_line(name if kind == "all" else "", kind, m, base.get(kind))
            )
        if row["metrics"]["all"].get("failed"):
            notes.append(
                f"{name}: {row['metrics']['all']['failed']} answers failed, e.g. {row['errors']}"
            )
    return "\n".join(lines + [""] + notes)
