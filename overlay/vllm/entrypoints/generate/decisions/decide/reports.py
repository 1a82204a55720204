# SPDX-License-Identifier: Apache-2.0
"""What an answer reports beyond its probabilities: ``extra.backend`` and ``extra.audit``. The backend's
own entries are laid in flat beside the service's, so a client reads one object per block whichever
backend answered. Imports nothing of the package."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel


class Rotation(BaseModel):
    first: str
    reversed: bool
    top: str


class DebiasAudit(BaseModel):
    debias: str
    rotations: list[Rotation]
    # The share of readings whose top option is the combined answer's.
    rotation_agreement: float


class PriorAudit(BaseModel):
    """``extra.audit.prior``."""

    mode: str
    # Each option's content-free log-probability (readings averaged), and whether it was cached.
    content_free: dict[str, float] | None = None
    cached: bool | None = None
    # Each option's fitted bias (readings averaged), or None when the mode has none.
    bias: dict[str, float] | None = None
    adjusted_logits: dict[str, float]


# Where a question's map came from (calibration/live_labels.py watches the labels file).
STARTUP = "startup"
LABELS_FILE = "labels file"


class MapFigures(BaseModel):
    """A question's own map's held-out figures beside its type's map's (calibration/question_map.py);
    ``version`` n is the n-th refit from the labels file."""

    labels: int
    log_loss: float
    accuracy: float
    type_log_loss: float
    type_accuracy: float
    gain: tuple[float, float]
    version: int = 0
    source: str = STARTUP


class QuestionMapAudit(MapFigures):
    """``extra.audit.question_map``; ``bias`` in logit units, scaled ``1 / calibration_temperature``."""

    bias: dict[str, float]


class ExamplesAudit(QuestionMapAudit):
    """``extra.audit.examples`` (calibration/examples.py): figures with examples, ``type_*`` without."""

    examples: int


class AbstentionReport(BaseModel):
    """``extra.abstention`` (calibration/abstention.py). ``threshold`` None: no threshold reaches the
    precision, every answer abstains, ``reason`` says why."""

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
    """``extra.backend``."""

    BASIC: ClassVar[tuple[str, ...]] = ("name", "option_logits")

    name: str
    option_logits: dict[str, float]
    facts: dict[str, Any] = {}

    def as_json(self, basic: bool = False) -> dict[str, Any]:
        own = {"name": self.name, "option_logits": dict(self.option_logits)}
        return own if basic else {**self.facts, **own}


class AuditRecord(BaseModel):
    """``extra.audit``: enough to reproduce or question the numbers."""

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
    # The calibration in force ("first pass" or "full") and its reads; None where nothing was calibrated.
    calibration_stage: str | None = None
    calibration_reads: int | None = None
    forward_passes: int
    input_tokens: int
    cached_input_tokens: int
    option_mass: float | None
    readout: str
    # The backend's own audit entries (``Reading.audit``).
    backend: dict[str, Any] = {}
    debias: DebiasAudit | None = None
    # The scores the temperature divided (option_logits stay raw).
    prior: PriorAudit | None = None
    question_map: QuestionMapAudit | None = None
    examples: ExamplesAudit | None = None

    def as_json(self, basic: bool = False) -> dict[str, Any]:
        nested = {"backend", "debias", "prior", "question_map", "examples"}
        if self.adapter is None:  # the base model's answers name no adapter
            nested.add("adapter")
        record = {**self.backend, **self.model_dump(exclude=nested)}
        if self.debias is not None:
            record.update(self.debias.model_dump())
        if self.prior is not None:
            record["prior"] = self.prior.model_dump(exclude_none=True)
        for name in ("question_map", "examples"):
            if (part := getattr(self, name)) is not None:
                record[name] = part.model_dump()
        return {k: record[k] for k in self.BASIC if k in record} if basic else record
