# SPDX-License-Identifier: Apache-2.0
"""Calibration question files: JSONL, one labelled question per line, in the operator format

    {"state": ..., "question": {a /v1/systemone question}, "expected": ..., "group": "...", "id": "..."}

A ``group`` keeps its lines in one cross-validation fold; an optional ``"precision"`` is asked of
the question's answers."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vllm.entrypoints.generate.decisions.calibration.in_force import question_key
from vllm.entrypoints.generate.decisions.decide.backends.registry import question_type
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    SCORE,
    CompiledQuestion,
    content_text,
)

BUNDLED = "bundled"


class QuestionFileError(ValueError):
    """A question file that can't be used; the message says which line and why."""


@dataclass(frozen=True)
class LabelledQuestion:
    state: str
    question: CompiledQuestion
    correct: int
    group: str
    id: str
    # The question as the file gives it, for tools that send it over the wire.
    raw: dict[str, Any]
    precision: float | None = None


@dataclass(frozen=True)
class QuestionFile:
    name: str
    sha256: str
    questions: tuple[LabelledQuestion, ...]

    def precisions(self) -> dict[str, float]:
        """The precision each question's lines ask, by question_key."""
        return {
            question_key(item.question): item.precision
            for item in self.questions
            if item.precision is not None
        }


def correct_index(question: CompiledQuestion, expected: Any) -> int:
    """Position of the expected answer among the question's options."""
    if question.qtype is NOUL:
        answer = {"yes": 0, "true": 0, "no": 1, "false": 1}.get(
            str(expected).strip().lower()
        )
        if answer is None:
            raise ValueError(
                f"expected must be yes/no or true/false for a noul question, got {expected!r}"
            )
        return answer
    if question.qtype is SCORE:
        if (
            isinstance(expected, bool)
            or not isinstance(expected, int)
            or not 0 <= expected < len(question.options)
        ):
            raise ValueError(
                f"expected must be a level number 0-{len(question.options) - 1}, got {expected!r}"
            )
        return expected
    keys = [str(option.value) for option in question.options]
    if question.qtype is CHOICE and str(expected) in keys:
        return keys.index(str(expected))
    keys = [option.key for option in question.options]
    if str(expected) in keys:
        return keys.index(str(expected))
    raise ValueError(f"expected {expected!r} is not one of the options {keys}")


def parse_line(number: int, line: str) -> LabelledQuestion:
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        raw = record["question"]
        kind = raw.get("type") if isinstance(raw, dict) else None
        qtype = question_type(kind) if isinstance(kind, str) else None
        if qtype is None:
            raise ValueError(f"unknown question type in {raw!r:.80}")
        question = qtype.compile(qtype.model.model_validate(raw))
        state = record["state"]
        if not isinstance(state, (str, dict, list)):
            raise ValueError("state must be text or a JSON object or array")
        identifier = str(record.get("id", f"line-{number}"))
        group = str(record.get("group") or identifier)
        correct = correct_index(question, record["expected"])
        return LabelledQuestion(
            content_text(state),
            question,
            correct,
            group,
            identifier,
            raw,
            asked_precision(record.get("precision")),
        )
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        detail = (
            f"missing field {exc}"
            if isinstance(exc, KeyError)
            else str(exc).splitlines()[0]
        )
        raise QuestionFileError(f"line {number}: {detail}") from None


def asked_precision(value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0.0 < value < 1.0
    ):
        raise ValueError(f"precision must be a number between 0 and 1, got {value!r}")
    return float(value)


def one_precision_per_question(lines: Sequence[tuple[int, LabelledQuestion]]) -> None:
    asked: dict[str, tuple[int, float]] = {}
    for number, item in lines:
        if item.precision is None:
            continue
        first = asked.setdefault(question_key(item.question), (number, item.precision))
        if first[1] != item.precision:
            raise QuestionFileError(
                f"line {number}: precision {item.precision:g} for a question line {first[0]} "
                f"asks {first[1]:g} of"
            )


def load(source: str) -> QuestionFile:
    """The bundled set (``source == "bundled"``) or an operator's file, parsed and checked whole."""
    if source == BUNDLED:
        data = resources.files(__package__).joinpath("bundled.jsonl").read_bytes()
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise QuestionFileError(f"can't read {source}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise QuestionFileError(f"{source} is not UTF-8 text") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise QuestionFileError(f"{source} has no questions")
    parsed = [(n, parse_line(n, line)) for n, line in lines]
    one_precision_per_question(parsed)
    questions = tuple(item for _, item in parsed)
    return QuestionFile(source, hashlib.sha256(data).hexdigest(), questions)
