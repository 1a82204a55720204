# SPDX-License-Identifier: Apache-2.0
"""Which label layout, prior correction and temperature each question is answered with.

The request's choice wins, else the server's setting; ``auto`` is calibration's choice for the type in
that layout (server's own backend only). The temperature follows the scores it divides: the chosen
pair's T, another pair's own (``type:layout:mode``), a question map's (``type:question``) or its kept
examples' (``type:examples``); a request's or configured T overrides all, and drops the examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import DecisionBackend
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.reading.calibrated import (
    Calibrated,
    QuestionExamples,
    QuestionMap,
    question_key,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior import PriorCache
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import Correction
from vllm.entrypoints.generate.decisions.decide.reading.read import ReadPlan, plan_read
from vllm.entrypoints.generate.decisions.decide.settings import (
    AUTO,
    PREFIX,
    Debias,
    PriorSetting,
    uses_fitted,
)
from vllm.entrypoints.generate.decisions.decide.temperature import Temperature


@dataclass(frozen=True)
class Asked:
    """What a request asked of its reads (None: the server's choice)."""

    debias: Debias
    prior: PriorSetting | None = None
    layout: str | None = None


@dataclass(frozen=True)
class Resolved:
    """How one question is read (``layout`` None: as the request has it)."""

    correction: Correction
    layout: str | None
    temperature: Temperature
    question_map: QuestionMap | None = None
    # Kept in-context examples (then ``question_map`` is the map fitted with them).
    examples: QuestionExamples | None = None

    def plan(
        self,
        backend: DecisionBackend,
        question: CompiledQuestion,
        context: ReadContext[Any],
        debias: Debias,
    ) -> ReadPlan:
        """The read this resolution asks for, its kept examples shown ahead of the input."""
        if self.examples is not None:
            context = context.with_examples(self.examples.context())
        return plan_read(
            backend,
            question,
            context,
            debias,
            self.correction,
            self.layout,
            self.temperature,
            self.question_map.bias if self.question_map is not None else None,
        )


class Corrections:
    """The server's prior setting, calibration's choices, and the shared content-free cache."""

    def __init__(
        self, setting: PriorSetting, cache_size: int, cache_bytes: int | None = None
    ) -> None:
        self.setting = setting
        self.cache = PriorCache(cache_size, cache_bytes)

    def resolve(
        self,
        question: CompiledQuestion,
        asked: Asked,
        calibrated: Calibrated,
        requested_t: float | None = None,
        measured: bool = True,
    ) -> Resolved:
        """``calibrated``: the calibration the request took; ``measured``: the backend it measured."""
        qtype = question.qtype.name
        maps, examples = calibrated.maps, calibrated.examples
        reads = calibrated.reads.get(qtype) if measured else None
        layout = asked.layout or (reads.layout if reads is not None else None)
        choice, own, key = None, False, None
        if reads is not None:
            key = (
                question_key(question) if reads.questions or maps or examples else None
            )
            choice, own = reads.for_question(key, layout)
        mode: str = asked.prior or self.setting
        if mode == AUTO:
            mode = choice.mode if choice is not None else "off"
        candidate = choice.candidates.get(mode) if choice is not None else None
        bias = candidate.bias if candidate is not None else None
        if uses_fitted(mode) and bias is None:
            where = "extra.prior" if asked.prior else f"{PREFIX}PRIOR"
            raise DecisionError(
                f"{where}={mode!r}: no position bias was fitted for {qtype} questions in this layout on this "
                f"server (startup calibration off, or too few {qtype} questions in its file); use off or content-free"
            )
        applied = calibrated.temperatures.applied(qtype, requested_t)
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
            shown = examples.get(key)
            own_map = shown.map if shown is not None else maps.get(key)
            if own_map is not None:
                scope = "examples" if shown is not None else "question"
                applied = Temperature(
                    1.0 / own_map.scale, "calibrated", f"{qtype}:{scope}"
                )
        return Resolved(
            Correction(mode, self.cache, bias), laid, applied, own_map, shown
        )
