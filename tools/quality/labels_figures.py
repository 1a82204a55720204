"""The offline part of tools/quality/labels.py: from cached reads of an operator's labels and of the
held-out set (ours, and a user's letter reads), what each row would serve on the held-out inputs, split
by split, and its figures.

Pure functions over question_file lines and accuracy_figures readings: testable without a server.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tools.quality.accuracy_figures import (
    Reading,
    batch_calibrated,
    metrics,
    question_id,
)
from vllm.entrypoints.generate.decisions.calibration import question_file
from vllm.entrypoints.generate.decisions.calibration.abstention import fit_abstention
from vllm.entrypoints.generate.decisions.calibration.fitting import (
    MIN_ANSWERED,
    type_fits,
)
from vllm.entrypoints.generate.decisions.calibration.in_force import (
    Abstention,
    QuestionMap,
)
from vllm.entrypoints.generate.decisions.calibration.maths import (
    FOLDS,
    HIGH_TEMPERATURE,
    LOW_TEMPERATURE,
    Labelled,
    calibrate,
    fold_of_groups,
)
from vllm.entrypoints.generate.decisions.calibration.question_map import (
    MIN_LABELS,
    choose_question_map,
)
from vllm.entrypoints.generate.decisions.decide.questions import top_index
from vllm.entrypoints.generate.decisions.decide.scoring import softmax

NO_LABELS = "no labels"
QUESTION_MAP = "labels -> per-question map"
# The labels as the server's calibration file (VLLM_TYPED_DECISIONS_CALIBRATION=FILE): each type's T
# refitted on them, then the per-question maps pulled toward it.
TYPE_T = "labels -> type T"
TYPE_T_MAP = "labels -> type T + per-question map"
BATCH = "batch calibration"
LETTERS = "letter logprobs"
LETTERS_MAP = "letter logprobs -> per-question map"
Item = question_file.LabelledQuestion


@dataclass
class Lines:
    """One file's lines and the server's reading of each, in the same order."""

    items: list[Item]
    readings: list[Reading]


def type_scale(reading: Reading) -> float:
    """1/T of the reading's type, as the server passes it to choose_question_map (within its range)."""
    return min(
        max(1.0 / reading.temperature, 1.0 / HIGH_TEMPERATURE), 1.0 / LOW_TEMPERATURE
    )


def draw_labels(items: Sequence[Item], per_question: int, seed: str) -> list[int]:
    """Indices of the labelled lines one split gives the server: per question, every line of
    ``per_question`` of its groups drawn at random (seeded), so an input is given whole or not at all."""
    groups: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for index, item in enumerate(items):
        groups[question_id(item)].setdefault(item.group, []).append(index)
    chosen = []
    for question, by_group in groups.items():
        names = sorted(by_group)
        # seeded per question, so a question's draw doesn't move when others are added
        random.Random(f"{seed}-{question}").shuffle(names)
        for name in names[:per_question]:
            chosen.extend(by_group[name])
    return sorted(chosen)


def labelled(labels: Lines, rows: Sequence[int]) -> Labelled:
    """The ``rows`` of ``labels`` as the fits take them."""
    return Labelled(
        [labels.readings[i].scores for i in rows],
        [labels.items[i].correct for i in rows],
        [labels.items[i].group for i in rows],
    )


def fitted_temperatures(labels: Lines, chosen: Sequence[int]) -> dict[str, float]:
    """Each type's T as a server given the ``chosen`` labelled lines as its calibration file fits it
    (calibration/fitting.py): server-wide on all of them, then each type with MIN_ANSWERED answered lines
    its own, by the same keep rules; a type without a fit of its own gets the server-wide T."""
    rows = [i for i in chosen if not labels.readings[i].error]
    types = [labels.items[i].question.qtype.name for i in rows]
    # Too few lines: the server's calibration fails and answers at T = 1.
    if len(rows) < MIN_ANSWERED:
        return dict.fromkeys(types, 1.0)
    server = calibrate(labelled(labels, rows)).applied_temperature
    fits = type_fits(set(types), types, labelled(labels, rows), server)
    return {name: fit.applied_temperature for name, fit in fits.items()}


def at_temperatures(lines: Lines, temperatures: dict[str, float]) -> Lines:
    """``lines`` read at each type's T from ``temperatures`` (the scores unchanged)."""
    return Lines(
        lines.items,
        [
            Reading(r.scores, temperatures.get(i.question.qtype.name, 1.0), r.seconds)
            if not r.error
            else r
            for i, r in zip(lines.items, lines.readings, strict=True)
        ],
    )


def answered_by_question(labels: Lines, chosen: Sequence[int]) -> dict[str, list[int]]:
    by_question: dict[str, list[int]] = defaultdict(list)
    for i in chosen:
        if not labels.readings[i].error:
            by_question[question_id(labels.items[i])].append(i)
    return by_question


def fit_maps(
    labels: Lines,
    chosen: Sequence[int],
    folds: int = FOLDS,
    minimum: int = MIN_LABELS,
) -> dict[str, QuestionMap | None]:
    """Per question among ``chosen`` labelled lines (answered ones): its map where the keep rule keeps
    one, else None (the type's softmax(scores / T) serves it); none for a question with fewer than
    ``minimum`` of them, as the server fits none (question_maps)."""
    maps: dict[str, QuestionMap | None] = {}
    for question, rows in answered_by_question(labels, chosen).items():
        if len(rows) < minimum:
            maps[question] = None
            continue
        maps[question] = choose_question_map(
            labelled(labels, rows),
            type_scale(labels.readings[rows[0]]),
            folds=folds,
        )
    return maps


def served(reading: Reading, question_map: QuestionMap | None) -> Reading:
    """The reading as it would be served: under the question's map where one is kept (as
    log-probabilities at T = 1), else unchanged (softmax(scores / T))."""
    if reading.error or question_map is None:
        return reading
    return Reading(question_map.log_probabilities(reading.scores), 1.0, reading.seconds)


def with_maps(lines: Lines, maps: dict[str, QuestionMap | None]) -> list[Reading]:
    return [
        served(r, maps.get(question_id(item)))
        for item, r in zip(lines.items, lines.readings, strict=True)
    ]


def confidence(reading: Reading) -> tuple[float, int]:
    """The served top probability and its option."""
    probabilities = softmax(reading.scores, reading.temperature)
    top = top_index(probabilities)
    return probabilities[top], top


def fold_maps(
    labels: Lines, rows: Sequence[int], training: Sequence[int], folds: int = FOLDS
) -> dict[str, QuestionMap | None]:
    """The maps one fold's labels are served by: fitted on ``training`` (the other folds of a
    question's answered labels ``rows``), none where the question has fewer than MIN_LABELS in all."""
    return (
        fit_maps(labels, training, folds, minimum=0) if len(rows) >= MIN_LABELS else {}
    )


def cross_validated(labels: Lines, chosen: Sequence[int], folds: int = FOLDS) -> Lines:
    """The chosen labelled lines (answered ones), each served by the maps fitted on the other folds of
    its question's labels (groups kept within a fold): what abstention may be fitted on. A question
    the server fits no map for (fewer than MIN_LABELS labels) gets none in any fold either."""
    out = Lines([], [])
    for rows in answered_by_question(labels, chosen).values():
        fold = fold_of_groups([labels.items[i].group for i in rows], folds)
        for f in sorted(set(fold)):
            training = [i for i, g in zip(rows, fold, strict=True) if g != f]
            maps = fold_maps(labels, rows, training, folds)
            for i in (i for i, g in zip(rows, fold, strict=True) if g == f):
                out.items.append(labels.items[i])
                out.readings.append(
                    served(labels.readings[i], maps.get(question_id(labels.items[i])))
                )
    return out


def _grouped_by_type(
    items: Sequence[Item], readings: Sequence[Reading]
) -> dict[str, tuple[list[Item], list[Reading]]]:
    kinds: dict[str, tuple[list[Item], list[Reading]]] = defaultdict(lambda: ([], []))
    for item, reading in zip(items, readings, strict=True):
        kinds[item.question.qtype.name][0].append(item)
        kinds[item.question.qtype.name][1].append(reading)
    return kinds


def fit_rules(
    items: Sequence[Item], readings: Sequence[Reading], precision: float
) -> dict[str, Abstention]:
    """Per type, the abstention rule fitted on these held-out labelled readings."""
    rules = {}
    for kind, (kind_items, kind_readings) in _grouped_by_type(items, readings).items():
        picks = [confidence(r) for r in kind_readings]
        rules[kind] = fit_abstention(
            [p for p, _ in picks],
            [
                top == item.correct
                for (_, top), item in zip(picks, kind_items, strict=True)
            ],
            [item.group for item in kind_items],
            precision,
        )
    return rules


def abstention_figures(
    items: Sequence[Item], readings: Sequence[Reading], rule: Abstention
) -> dict[str, Any]:
    """The share of answered readings that abstain under ``rule``, and the precision of the rest."""
    given = [
        (top == item.correct)
        for item, r in zip(items, readings, strict=True)
        if not r.error
        for p, top in [confidence(r)]
        if rule.clears(p)
    ]
    answered = sum(not r.error for r in readings)
    return {
        "abstention_rate": 1 - len(given) / answered if answered else None,
        "precision_reached": sum(given) / len(given) if given else None,
        "threshold": rule.threshold,
    }


def one_answer(items: Sequence[Item], readings: Sequence[Reading]) -> int:
    """How many questions asked at least twice had every answered input given the same answer."""
    picks: dict[str, set[int]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for item, r in zip(items, readings, strict=True):
        if not r.error:
            picks[question_id(item)].add(confidence(r)[1])
            counts[question_id(item)] += 1
    return sum(len(picks[q]) == 1 for q in picks if counts[q] >= 2)


def figures(
    heldout: Lines,
    readings: list[Reading],
    seed: int,
    rules: dict[str, Abstention] | None = None,
    maps: dict[str, QuestionMap | None] | None = None,
) -> dict[str, Any]:
    """One row's figures on the held-out lines, per type and per question."""
    types: dict[str, Any] = {}
    grouped = _grouped_by_type(heldout.items, readings)
    for kind in sorted(grouped):
        kind_items, kind_readings = grouped[kind]
        entry = metrics(kind_items, kind_readings, seed)
        entry["one_answer"] = one_answer(kind_items, kind_readings)
        if maps is not None:
            asked = {question_id(i) for i in kind_items}
            entry["labelled"] = sum(q in maps for q in asked)
            entry["maps_kept"] = sum(maps.get(q) is not None for q in asked)
        if rules is not None and kind in rules:
            entry.update(abstention_figures(kind_items, kind_readings, rules[kind]))
        types[kind] = entry
    questions: dict[str, Any] = {}
    by_question: dict[str, list[int]] = defaultdict(list)
    for index, item in enumerate(heldout.items):
        by_question[question_id(item)].append(index)
    for question, rows in by_question.items():
        chosen_items = [heldout.items[i] for i in rows]
        chosen = [readings[i] for i in rows]
        answered = [
            (i, r) for i, r in zip(chosen_items, chosen, strict=True) if not r.error
        ]
        hits = [confidence(r)[1] == i.correct for i, r in answered]
        questions[question] = {
            "n": len(answered),
            "accuracy": sum(hits) / len(hits) if hits else None,
            "log_loss": (
                statistics.fmean(
                    -math.log(max(softmax(r.scores, r.temperature)[i.correct], 1e-300))
                    for i, r in answered
                )
                if answered
                else None
            ),
            "one_answer": one_answer(chosen_items, chosen),
            # whether the question's map was kept, where it had labels
            **(
                {"kept": maps[question] is not None}
                if maps is not None and question in maps
                else {}
            ),
        }
    return {"types": types, "questions": questions}


def majority(items: Sequence[Item]) -> dict[str, float]:
    """Per question, the share of its lines whose answer is its most common one."""
    answers: dict[str, list[int]] = defaultdict(list)
    for item in items:
        answers[question_id(item)].append(item.correct)
    return {q: max(a.count(c) for c in set(a)) / len(a) for q, a in answers.items()}


def summary(values: Sequence[Any]) -> Any:
    """Mean and spread (sample standard deviation) over splits of each figure; an ECE (value,
    interval) counts by its value; a figure missing from some splits averages over the rest."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if isinstance(present[0], dict):
        keys = dict.fromkeys(k for v in present for k in v)
        return {k: summary([v.get(k) for v in present]) for k in keys}
    if isinstance(present[0], (tuple, list)):
        present = [v[0] for v in present]
    numbers = [float(v) for v in present]
    return {
        "mean": statistics.fmean(numbers),
        "sd": statistics.stdev(numbers) if len(numbers) > 1 else 0.0,
        "splits": len(numbers),
    }


def split_figures(
    labels: Lines,
    heldout: Lines,
    chosen: Sequence[int],
    precision: float,
    seed: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One split's figures for one read: as read (abstention fitted on the drawn labels as read), and
    under the maps fitted on the drawn labels (abstention fitted on their cross-validated reads)."""
    given = [labels.items[i] for i in chosen if not labels.readings[i].error]
    plain = [labels.readings[i] for i in chosen if not labels.readings[i].error]
    as_read = figures(
        heldout, heldout.readings, seed, fit_rules(given, plain, precision)
    )
    maps = fit_maps(labels, chosen)
    validated = cross_validated(labels, chosen)
    mapped = figures(
        heldout,
        with_maps(heldout, maps),
        seed,
        fit_rules(validated.items, validated.readings, precision),
        maps,
    )
    return as_read, mapped


def evaluate(
    labels: Lines,
    heldout: Lines,
    splits: int,
    per_question: int,
    precision: float,
    seed: int = 0,
    off: list[Reading] | None = None,
    letters: tuple[Lines, Lines] | None = None,
) -> dict[str, Any]:
    """Every row's figures, mean and spread over ``splits`` seeded draws of the labels; ``off`` (the
    held-out lines read with no correction) adds the batch calibration row, ``letters`` (the user's
    letter reads of the labels and the held-out lines, in the same order) the two letter rows."""
    reads = {(NO_LABELS, QUESTION_MAP): (labels, heldout)}
    if letters is not None:
        reads[(LETTERS, LETTERS_MAP)] = letters
    rows: dict[str, list[dict[str, Any]]] = {
        name: [] for pair in [*reads, (TYPE_T, TYPE_T_MAP)] for name in pair
    }
    drawn, temperatures = [], []
    for split in range(splits):
        chosen = draw_labels(labels.items, per_question, f"{seed}-{split}")
        drawn.append(len(chosen))
        fitted = fitted_temperatures(labels, chosen)
        temperatures.append(fitted)
        refitted = tuple(at_temperatures(lines, fitted) for lines in (labels, heldout))
        for (as_read, mapped), (given, asked) in [
            *reads.items(),
            ((TYPE_T, TYPE_T_MAP), refitted),
        ]:
            figures_ = split_figures(given, asked, chosen, precision, seed)
            rows[as_read].append(figures_[0])
            rows[mapped].append(figures_[1])
    results: dict[str, Any] = {
        "rows": {name: summary(values) for name, values in rows.items()},
        "majority": majority(heldout.items),
        "labels_drawn": summary(drawn),
        "type_temperatures": summary(temperatures),
    }
    if off is not None:
        results["rows"][BATCH] = summary(
            [figures(heldout, batch_calibrated(heldout.items, off), seed)]
        )
    return results


# --- output -----------------------------------------------------------------------------------

TYPE_COLUMNS = [
    ("n", "questions", "{:.0f}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("confidence", "mean_confidence", "{:.3f}"),
    ("majority", "majority_baseline", "{:.3f}"),
    ("mean acc/q", "mean_accuracy_per_question", "{:.3f}"),
    ("log loss", "log_loss", "{:.3f}"),
    ("ECE", "ece_calibrated", "{:.3f}"),
    ("ECE floor", "ece_floor", "{:.3f}"),
    ("collapsed", "collapsed", "{:.1f}"),
    ("one answer", "one_answer", "{:.1f}"),
    ("labelled", "labelled", "{:.0f}"),
    ("maps kept", "maps_kept", "{:.1f}"),
    ("abstains", "abstention_rate", "{:.2f}"),
    ("precision", "precision_reached", "{:.3f}"),
]


def cell(figure: dict[str, Any] | None, form: str) -> str:
    """``mean ± sd`` over splits (the sd left out where there was one split or none varied)."""
    if not figure:
        return "-"
    mean = form.format(figure["mean"])
    return mean if not figure["sd"] else f"{mean} ± {form.format(figure['sd'])}"


def table(results: dict[str, Any], names: dict[str, str]) -> str:
    """Per type, then per question (held-out accuracy under each row), as markdown."""
    lines = [
        "| row | type | " + " | ".join(c for c, _, _ in TYPE_COLUMNS) + " |",
        "|" + "---|" * (len(TYPE_COLUMNS) + 2),
    ]
    for row, figures_ in results["rows"].items():
        for kind, entry in figures_["types"].items():
            cells = [cell(entry.get(key), form) for _, key, form in TYPE_COLUMNS]
            lines.append(f"| {row} | {kind} | " + " | ".join(cells) + " |")
    rows = list(results["rows"])
    lines += [
        "",
        "| question | majority | "
        + " | ".join(f"{row}: accuracy" for row in rows)
        + " | map kept |",
        "|" + "---|" * (len(rows) + 3),
    ]
    mapped = results["rows"].get(QUESTION_MAP, {}).get("questions", {})
    for question, share in results["majority"].items():
        accuracies = [
            cell(
                (results["rows"][row]["questions"].get(question) or {}).get("accuracy"),
                "{:.3f}",
            )
            for row in rows
        ]
        kept = cell((mapped.get(question) or {}).get("kept"), "{:.1f}")
        lines.append(
            f"| {names.get(question, question)} | {share:.3f} | "
            + " | ".join(accuracies)
            + f" | {kept} |"
        )
    return "\n".join(lines)


def question_names(items: Sequence[Item]) -> dict[str, str]:
    """A short name per question: its type and the start of its instructions."""
    names: dict[str, str] = {}
    for item in items:
        text = item.raw.get("instructions") or ""
        short = text if len(text) <= 60 else text[:57] + "..."
        names.setdefault(question_id(item), f"{item.question.qtype.name}: {short}")
    return names
