# SPDX-License-Identifier: Apache-2.0
"""The calibration record as reads apply it: what each question type reads with, questions' own maps,
examples and abstention rules, and how one question resolves against them. Its T follows the scores it
divides: the chosen pair's, another pair's own (``type:layout:mode``), a question map's
(``type:question``) or its examples' (``type:examples``); a request's or configured T overrides all and
drops the examples."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import Example
from vllm.entrypoints.generate.decisions.decide.reading.corrections import (
    Asked,
    Calibration,
    Corrections,
)
from vllm.entrypoints.generate.decisions.decide.reading.read import Resolved
from vllm.entrypoints.generate.decisions.decide.reports import (
    AbstentionReport,
    ExamplesAudit,
    MapFigures,
    QuestionMapAudit,
)
from vllm.entrypoints.generate.decisions.decide.temperature import (
    Temperature,
)

FloatArray = npt.NDArray[np.float64]

# a -inf score (an option the reading gives nothing) enters every fit, and every map, here
SCORE_FLOOR = -30.0


def floored_scores(
    scores: Sequence[Sequence[float]], width: int | None = None
) -> FloatArray:
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


def log_softmax_rows(logits: FloatArray) -> FloatArray:
    """Each row's log-softmax, stable for any logits."""
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


def keeps(
    gain: tuple[float, float] | None, accuracy: float, baseline_accuracy: float
) -> bool:
    """The keep rule: a gain whose whole interval is above zero, and no lower accuracy."""
    return gain is not None and gain[0] > 0 and accuracy >= baseline_accuracy


class Candidate(BaseModel):
    """A correction's held-out figures; ``gain`` is the 95% interval of its log-loss gain over the
    baseline (None for the baseline), ``bias`` the fitted modes' per position, in score units."""

    log_loss: float
    accuracy: float
    temperature: float
    bias: list[float] | None = None
    gain: tuple[float, float] | None = None
    # Each question's held-out loss by its id, for pairing (not saved).
    _losses: dict[str, float] = PrivateAttr(default_factory=dict)

    def beats(self, baseline: Candidate) -> bool:
        return keeps(self.gain, self.accuracy, baseline.accuracy)


class ReadChoice(BaseModel):
    """A question type's chosen correction (``mode``) and every correction's figures, in one layout."""

    mode: str
    candidates: dict[str, Candidate]
    forced: bool = False  # the operator's setting, not the figures' choice
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
            kept = self.kept
            low, high = kept.gain or (0.0, 0.0)
            verdict = (
                f"{self.mode} kept (held-out log loss {off.log_loss:.3f} -> {kept.log_loss:.3f}, gain 95% "
                f"[{low:.3f}, {high:.3f}], accuracy {off.accuracy:.3f} -> {kept.accuracy:.3f})"
            )
        return f"decision reads ({name}): {verdict}; log loss/accuracy: {figures}"


# The key of a backend's one way of reading, where it has no layouts to compare.
SINGLE = "single"


def question_key(question: CompiledQuestion) -> str:
    """A question's name in a calibration file and in requests (options sorted: order doesn't matter)."""
    options = sorted([o.key, o.text] for o in question.options)
    return json.dumps(
        [question.qtype.name, question.instructions, options], ensure_ascii=False
    )


class TypeReads(BaseModel):
    """A question type's reads: the layout kept (None: the backend has one), each layout's choice, and
    in the kept layout the own choices of questions the file labels many times (by question_key)."""

    layout: str | None = None
    by_layout: dict[str, ReadChoice]
    questions: dict[str, ReadChoice] = Field(default_factory=dict)

    def for_question(
        self, key: str | None, layout: str | None
    ) -> tuple[ReadChoice | None, bool]:
        """The choice a question read in ``layout`` gets, and whether it is the question's own."""
        if key is not None and layout == self.layout and key in self.questions:
            return self.questions[key], True
        return self.by_layout.get(layout or SINGLE), False

    @property
    def chosen(self) -> ReadChoice:
        return self.by_layout[self.layout or SINGLE]

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
            verdict = f"{baseline} labels kept (no other layout did better)"
        else:
            off, kept = self.by_layout[baseline].candidates["off"], self.chosen.kept
            verdict = (
                f"{self.layout} labels kept (held-out log loss "
                f"{off.log_loss:.3f} -> {kept.log_loss:.3f}, accuracy {off.accuracy:.3f} -> {kept.accuracy:.3f} "
                f"against {baseline} without a correction)"
            )
        return [*lines, f"decision reads ({name}): {verdict}", *own]


class QuestionMap(MapFigures):
    """A question's own map ``softmax(scale * s + bias)`` (client option order, ``bias`` in logit
    units, centred), with its figures."""

    scale: float
    bias: list[float]

    @property
    def kept(self) -> bool:
        """The type's keep rule, against the type's map."""
        return keeps(self.gain, self.accuracy, self.type_accuracy)

    def audit(self, keys: Sequence[str]) -> QuestionMapAudit:
        """An answer's ``extra.audit.question_map`` (``keys``: the options')."""
        figures = self.model_dump(include=set(MapFigures.model_fields))
        return QuestionMapAudit(**figures, bias=dict(zip(keys, self.bias, strict=True)))

    def log_line(self, name: str) -> str:
        return (
            f"decision calibration ({name}): a map of its own kept from {self.labels} labels "
            f"(held-out log loss {self.type_log_loss:.3f} -> {self.log_loss:.3f}, accuracy "
            f"{self.type_accuracy:.3f} -> {self.accuracy:.3f}; gain interval "
            f"[{self.gain[0]:.3f}, {self.gain[1]:.3f}])"
        )

    def log_probabilities(self, scores: Sequence[float]) -> list[float]:
        """One read's log-probabilities; ``-inf`` enters at SCORE_FLOOR, as in the fit."""
        matrix = floored_scores([scores], len(self.bias))
        return log_softmax_rows(self.scale * matrix + np.asarray(self.bias))[0].tolist()

    def probabilities(self, scores: Sequence[float]) -> list[float]:
        return np.exp(self.log_probabilities(scores)).tolist()


class LabelledRead(BaseModel):
    """One labelled read a map is fitted on: corrected scores and ``1 / T``, the scale the map is pulled
    toward; startup's reads keep answer and group (a labels file's refit pools with them)."""

    state_sha256: str
    question: str
    scores: list[float]
    scale: float
    correct: int | None = None
    group: str | None = None


class ShownExample(BaseModel):
    """One saved example: its input and the key of the option answering it."""

    state: str
    answer: str


class QuestionExamples(MapFigures):
    """A question's examples and the map of reads with them; ``type_*`` figures: the same labels read
    without them, under the same kind of map."""

    examples: list[ShownExample]
    scale: float
    bias: list[float]
    # Where the operator asks the question a precision: its threshold on reads with these examples.
    abstention: Abstention | None = None

    @property
    def kept(self) -> bool:
        return self.map.kept

    @cached_property
    def map(self) -> QuestionMap:
        return QuestionMap(**self.model_dump(include=set(QuestionMap.model_fields)))

    def audit(self, keys: Sequence[str]) -> ExamplesAudit:
        audit = self.map.audit(keys).model_dump()
        return ExamplesAudit(**audit, examples=len(self.examples))

    def context(self) -> tuple[Example, ...]:
        return tuple(Example(shown.state, shown.answer) for shown in self.examples)

    def log_line(self, name: str) -> str:
        verdict = "kept" if self.kept else "not kept"
        return (
            f"decision calibration ({name}): {len(self.examples)} in-context examples {verdict} "
            f"over {self.labels} labels (held-out log loss {self.type_log_loss:.3f} without -> "
            f"{self.log_loss:.3f} with, accuracy {self.type_accuracy:.3f} -> {self.accuracy:.3f}; "
            f"gain interval [{self.gain[0]:.3f}, {self.gain[1]:.3f}])"
        )


Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class Abstention(BaseModel):
    """An abstention rule: an answer below ``threshold`` abstains (all when None; ``reason`` says
    why). Figures are on the held-out labels it was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    precision_asked: float = Field(gt=0.0, lt=1.0, allow_inf_nan=False)
    threshold: Share | None
    # Of the held-out answers clearing the threshold: precision, its lower bound, their share.
    precision_reached: Share | None
    precision_bound: Share | None
    coverage: Share
    answered: int = Field(ge=0)
    labels: int = Field(ge=0)
    groups: int = Field(ge=0)
    reason: str | None = None
    scope: Literal["type", "question"] = "type"

    @property
    def abstains_always(self) -> bool:
        return self.threshold is None

    def clears(self, confidence: float) -> bool:
        return self.threshold is not None and confidence >= self.threshold

    def log_line(self, name: str, source: str = "decision calibration") -> str:
        if self.threshold is None:
            return f"{source} ({name}): every answer abstains: {self.reason}"
        return (
            f"{source} ({name}): precision {self.precision_asked:g} above confidence "
            f"{self.threshold:.3f} (held-out precision {self.precision_reached:.3f}, lower bound "
            f"{self.precision_bound:.3f}; {self.coverage:.0%} of {self.labels} labelled answers answered)"
        )

    def report(self, confidence: float) -> AbstentionReport:
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


@dataclass(frozen=True)
class Calibrated(Calibration):
    """What calibration gives the server. ``stage``: FIRST_PASS, FULL or None (the full calibration
    failed); ``question_reads``: the labelled reads answered (None in a record saved before it was
    counted)."""

    reads: Mapping[str, TypeReads] = field(default_factory=dict)
    # By question_key: questions' own maps from the operator's labels.
    maps: Mapping[str, QuestionMap] = field(default_factory=dict)
    abstention: Mapping[str, Abstention] = field(default_factory=dict)
    # How many times the labels file the server watches has refitted ``maps`` (0: startup's maps).
    maps_version: int = 0
    # The saved record's key (None: none saved): run-time maps are saved under it.
    key: Mapping[str, Any] | None = None
    examples: Mapping[str, QuestionExamples] = field(default_factory=dict)
    question_abstention: Mapping[str, Abstention] = field(default_factory=dict)
    # Startup's labelled reads, which a labels file's refit pools with.
    labelled: tuple[LabelledRead, ...] = ()

    def abstention_for(
        self, question: CompiledQuestion, examples: QuestionExamples | None = None
    ) -> Abstention | None:
        """The question's own rule (read with ``examples``'s where it was), else its type's."""
        if examples is not None and examples.abstention is not None:
            return examples.abstention
        if self.question_abstention:
            own = self.question_abstention.get(question_key(question))
            if own is not None:
                return own
        return self.abstention.get(question.qtype.name)

    def resolve(
        self,
        question: CompiledQuestion,
        asked: Asked,
        corrections: Corrections,
        requested_t: float | None = None,
        measured: bool = True,
    ) -> Resolved:
        qtype = question.qtype.name
        reads = self.reads.get(qtype) if measured else None
        layout = asked.layout or (reads.layout if reads is not None else None)
        choice, own, key = None, False, None
        if reads is not None:
            if reads.questions or self.maps or self.examples:
                key = question_key(question)
            choice, own = reads.for_question(key, layout)
        mode = corrections.mode(asked, choice.mode if choice is not None else "off")
        candidate = choice.candidates.get(mode) if choice is not None else None
        bias = candidate.bias if candidate is not None else None
        correction = corrections.correction(qtype, asked, mode, bias)
        applied = self.temperatures.applied(qtype, requested_t)
        chosen = reads is not None and choice is reads.chosen and mode == choice.mode
        if applied.source == "calibrated" and candidate is not None and not chosen:
            scope = ":".join(
                part for part in (qtype, "question" if own else layout, mode) if part
            )
            applied = Temperature(candidate.temperature, "calibrated", scope)
        laid = layout if asked.layout is None and reads is not None else None
        # A question's own map (and its examples) were fitted on its scores as calibration chose to
        # read them, so they apply to those reads only, under no T set by the request or operator.
        own_map, shown = None, None
        if (
            key is not None
            and reads is not None
            and layout == reads.layout
            and choice is not None
            and mode == choice.mode
            and applied.source == "calibrated"
        ):
            shown = self.examples.get(key)
            own_map = shown.map if shown is not None else self.maps.get(key)
            if own_map is not None:
                scope = "examples" if shown is not None else "question"
                applied = Temperature(
                    1.0 / own_map.scale, "calibrated", f"{qtype}:{scope}"
                )
        keys = [o.key for o in question.options]
        # The threshold is fitted on calibrated answers, so it applies only to a calibrated T.
        abstention = self.abstention_for(question, shown)
        return Resolved(
            correction,
            laid,
            applied,
            own_map.bias if own_map is not None else None,
            shown.context() if shown is not None else (),
            own_map.audit(keys) if own_map is not None and shown is None else None,
            shown.audit(keys) if shown is not None else None,
            abstention.report
            if abstention is not None and applied.source == "calibrated"
            else None,
        )
