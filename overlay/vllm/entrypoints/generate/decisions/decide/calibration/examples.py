# SPDX-License-Identifier: Apache-2.0
"""In-context examples: a labelled question asked with a few of its own labelled inputs, answered,
ahead of the input.

A small model told what the answers to a question look like may read it better than any map of its
scores can make it. Or worse: examples can pull every answer toward the labels they show. So a
question's examples are measured as its maps are: each labelled input is read with examples picked
from the other folds of its question's labels (never itself, never its group), a map of the
question's own is fitted on those reads, and the held-out log loss is compared, input by input, with
the same map fitted on its reads without examples, so that the gain measured is the examples' and not
a map's. They are kept by the same rule (the gain's interval above zero, accuracy not lower), and
served with examples picked from all the labels. Pure functions over plain sequences: testable
without an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from pydantic import BaseModel

from vllm.entrypoints.generate.decisions.decide.calibration.abstention import (
    Abstention,
    held_out_threshold,
)
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    QuestionMap,
    compared,
    fit_map,
    held_out,
)
from vllm.entrypoints.generate.decisions.decide.read_context import Example
from vllm.entrypoints.generate.decisions.decide.reports import (
    ExamplesAudit,
    MapFigures,
)

# An input longer than this is not shown as an example: examples sit in every prompt of their
# question, and a long one would crowd out the input itself.
MAX_EXAMPLE_CHARS = 1500


class ShownExample(BaseModel):
    """One example as saved: its input and the key of the option that answers it."""

    state: str
    answer: str


class QuestionExamples(MapFigures):
    """A question's examples and the map its answers get with them (``softmax(scale * s + bias)``
    on the scores read with them), with their figures: ``log_loss`` and ``accuracy`` are held out
    with examples, ``type_log_loss`` and ``type_accuracy`` on the same labels read without them,
    under the same kind of map."""

    examples: list[ShownExample]
    scale: float
    bias: list[float]
    # Where the operator's file asks the question a precision: its threshold on answers read with
    # these examples (their held-out reads under the examples' map), which then replaces its own.
    abstention: Abstention | None = None

    @property
    def kept(self) -> bool:
        """The maps' keep rule (QuestionMap.kept) against the reads without examples."""
        return self.map.kept

    @cached_property
    def map(self) -> QuestionMap:
        """The map answers read with these examples get (its figures these examples'); built once,
        not per request."""
        figures = self.model_dump(include=set(MapFigures.model_fields))
        return QuestionMap(**figures, scale=self.scale, bias=self.bias)

    def audit(self, keys: Sequence[str]) -> ExamplesAudit:
        """What an answer's ``extra.audit.examples`` says (``keys``: the options')."""
        mapped = self.map.audit(keys)
        return ExamplesAudit(**mapped.model_dump(), examples=len(self.examples))

    def context(self) -> tuple[Example, ...]:
        """The examples as a read carries them (read_context.ReadContext.examples)."""
        return tuple(Example(shown.state, shown.answer) for shown in self.examples)

    def log_line(self, name: str) -> str:
        verdict = "kept" if self.kept else "not kept"
        return (
            f"decision calibration ({name}): {len(self.examples)} in-context examples {verdict} "
            f"over {self.labels} labels (held-out log loss {self.type_log_loss:.3f} without -> "
            f"{self.log_loss:.3f} with, accuracy {self.type_accuracy:.3f} -> {self.accuracy:.3f}; "
            f"gain interval [{self.gain[0]:.3f}, {self.gain[1]:.3f}])"
        )


def pick_examples(
    states: Sequence[str], answers: Sequence[str], count: int
) -> list[int]:
    """Which of a question's labelled inputs to show (indices, at most ``count``): the answers in
    turn, each in order of its first appearance, each answer's inputs in file order, inputs over
    MAX_EXAMPLE_CHARS left out; so no answer is shown twice before every answer seen is shown once."""
    queues: dict[str, list[int]] = {}
    for index, (state, answer) in enumerate(zip(states, answers, strict=True)):
        if len(state) <= MAX_EXAMPLE_CHARS:
            queues.setdefault(answer, []).append(index)
    picked: list[int] = []
    while len(picked) < count and any(queues.values()):
        for queue in queues.values():
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def measure_examples(
    examples: Sequence[ShownExample],
    plain: Sequence[Sequence[float]],
    shown: Sequence[Sequence[float]],
    correct: Sequence[int],
    groups: Sequence[str],
    scale: float,
    precision: float | None = None,
) -> QuestionExamples:
    """``examples`` measured on a question's labels: ``plain`` each label's scores read without
    examples and ``shown`` read with examples from the other folds (both as its type corrects
    them); ``scale`` the type's (both maps are pulled toward it); ``precision`` the one the
    operator asks of the question, if any."""
    base, _ = held_out(plain, correct, groups, scale)
    with_examples, _ = held_out(shown, correct, groups, scale)
    fitted_scale, fitted_bias = fit_map(shown, correct, scale)
    return QuestionExamples(
        examples=list(examples),
        scale=fitted_scale,
        bias=fitted_bias,
        abstention=(
            held_out_threshold(with_examples, correct, groups, precision)
            if precision is not None
            else None
        ),
        **compared(with_examples, base, correct, groups),
    )
