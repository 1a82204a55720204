# SPDX-License-Identifier: Apache-2.0
"""What an answer reports beyond its probabilities, typed: the backend's facts (``extra.backend``) and
the audit record (``extra.audit``), each with what ``detail: basic`` keeps of it, and the audit's parts
from option rotation (reading/rotation.py), prior corrections (reading/prior_reads.py) and a question's
own map (calibration/question_map.py). Imports nothing of the package.

The backend's own entries (``Reading.meta`` and ``Reading.audit``) are laid in flat beside the
service's, so a client reads one object per block whichever backend answered.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel


class Rotation(BaseModel):
    """One reading of a debiased question: the option it listed first, whether it reversed a scale,
    and the option it put on top."""

    first: str
    reversed: bool
    top: str


class DebiasAudit(BaseModel):
    """What a debiased answer's ``extra.audit`` says about its readings."""

    debias: str
    rotations: list[Rotation]
    # The share of readings whose top option is the combined answer's.
    rotation_agreement: float


class PriorAudit(BaseModel):
    """``extra.audit.prior``: the correction applied and the scores the temperature divides."""

    mode: str
    # Each option's content-free log-probability (readings averaged), and whether it was cached.
    content_free: dict[str, float] | None = None
    cached: bool | None = None
    # Each option's fitted bias (readings averaged), or None when the mode has none.
    bias: dict[str, float] | None = None
    adjusted_logits: dict[str, float]


# Where a question's map came from: the calibration file at startup, or the labels file the server
# watches (runtime/live_labels.py).
STARTUP = "startup"
LABELS_FILE = "labels file"


class MapFigures(BaseModel):
    """What a question's own map (calibration/question_map.py) was fitted on and how it did: its
    labels, its held-out log loss and accuracy beside the type's map's and the gain's interval (what
    the keep rule kept it on), and which fit it is: ``version`` 0 from startup's file, n the n-th refit
    from the labels file."""

    labels: int
    log_loss: float
    accuracy: float
    type_log_loss: float
    type_accuracy: float
    gain: tuple[float, float]
    version: int = 0
    source: str = STARTUP


class QuestionMapAudit(MapFigures):
    """``extra.audit.question_map``: the question's map's figures and each option's bias (logit units;
    the scale is ``1 / calibration_temperature``)."""

    bias: dict[str, float]


class ExamplesAudit(QuestionMapAudit):
    """``extra.audit.examples``: the question was asked with ``examples`` of its labelled inputs ahead
    of the input (calibration/examples.py), and its scores mapped by the map fitted on such reads;
    the figures are held out with examples, ``type_*`` without them."""

    examples: int


class AbstentionReport(BaseModel):
    """``extra.abstention``: whether this answer clears the confidence threshold fitted for the
    precision the operator asked of its type or question (``abstain`` False) or not, with what the threshold was
    fitted for and reached on held-out labels (calibration/abstention.py). ``threshold`` None: no
    threshold reaches the precision, every answer abstains, ``reason`` says why."""

    abstain: bool
    precision: float
    threshold: float | None
    precision_reached: float | None
    coverage: float
    labels: int
    reason: str | None = None
    # "type": fitted on the question type's labelled answers; "question": on this question's own.
    scope: str = "type"


class BackendReport(BaseModel):
    """``extra.backend``: which backend answered, each option's raw score, and the backend's facts."""

    BASIC: ClassVar[tuple[str, ...]] = ("name", "option_logits")

    name: str
    option_logits: dict[str, float]
    facts: dict[str, Any] = {}

    def as_json(self, basic: bool = False) -> dict[str, Any]:
        own = {"name": self.name, "option_logits": dict(self.option_logits)}
        return own if basic else {**self.facts, **own}


class AuditRecord(BaseModel):
    """``extra.audit``: what produced the numbers, enough to reproduce or question them."""

    BASIC: ClassVar[tuple[str, ...]] = (
        "calibration_temperature",
        "temperature_source",
        "temperature_scope",
        "calibration_stage",
        "readout",
        "forward_passes",
        "adapter",
    )

    served_model: str
    # The LoRA adapter the reads went through (None: the base model); served_model then names it too.
    adapter: str | None = None
    state_sha256: str
    render_version: str
    confidence_formula: str
    calibration_temperature: float
    temperature_source: str
    temperature_scope: str
    # What the server's calibration in force was fitted on: "first pass" (answers meanwhile, while the
    # full one reads on) or "full", and its labelled question reads; None where nothing was calibrated.
    calibration_stage: str | None = None
    calibration_reads: int | None = None
    forward_passes: int
    input_tokens: int
    cached_input_tokens: int
    option_mass: float | None
    readout: str
    # The backend's own audit entries (``Reading.audit``), and the readings behind a debiased answer.
    backend: dict[str, Any] = {}
    debias: DebiasAudit | None = None
    # The prior correction applied and the scores the temperature divided (option_logits stay raw).
    prior: PriorAudit | None = None
    # The question's own map from the operator's labels, where one is kept (temperature_scope says so).
    question_map: QuestionMapAudit | None = None
    # The in-context examples it was asked with, and their map, where they are kept.
    examples: ExamplesAudit | None = None

    def as_json(self, basic: bool = False) -> dict[str, Any]:
        # The base model's answers name no adapter.
        nested = {"backend", "debias", "prior", "question_map", "examples"} | (
            {"adapter"} if self.adapter is None else set()
        )
        record = {
            **self.backend,
            **self.model_dump(exclude=nested),
            **(self.debias.model_dump() if self.debias is not None else {}),
            **(
                {"prior": self.prior.model_dump(exclude_none=True)}
                if self.prior is not None
                else {}
            ),
            **(
                {"question_map": self.question_map.model_dump()}
                if self.question_map is not None
                else {}
            ),
            **(
                {"examples": self.examples.model_dump()}
                if self.examples is not None
                else {}
            ),
        }
        return {k: record[k] for k in self.BASIC if k in record} if basic else record
