# SPDX-License-Identifier: Apache-2.0
"""Which label layout, prior correction (prior.py) and temperature each question is answered with.

The request's choice wins (``extra.prior``; the layout in ``extra.backend_options``), else the server's
VLLM_TYPED_DECISIONS_PRIOR; ``auto`` is what startup calibration chose for the question's type in that
layout (``off`` where it chose nothing; a question the calibration file labelled many times may have
a fitted bias of its own), and a type read in another layout than the backend's first is read so
unless the request names one. Calibration's choices apply to the server's own backend only.
The temperature follows the scores it divides: the type's calibrated T for the layout and correction
calibration chose, that pair's own fitted T (scope ``type:layout:mode``) for another, the server-wide
T where the type has no fits; a question the operator's labels gave a map of its own
(calibration/question_map.py) gets its scale as a T (scope ``type:question``) and its bias, and one
whose in-context examples were kept (calibration/examples.py) is read with them and gets the map
fitted on such reads (scope ``type:examples``). A request's or a configured T overrides them all,
as before, and then the question is read without examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.generate.decisions.decide.calibration.abstention import Abstention
from vllm.entrypoints.generate.decisions.decide.calibration.bias import (
    TypeReads,
    question_key,
)
from vllm.entrypoints.generate.decisions.decide.calibration.examples import (
    QuestionExamples,
)
from vllm.entrypoints.generate.decisions.decide.calibration.question_map import (
    LabelledRead,
    QuestionMap,
)
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.prior_modes import (
    AUTO,
    PriorSetting,
    uses_fitted,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.reading.prior import (
    PriorCache,
)
from vllm.entrypoints.generate.decisions.decide.reading.prior_reads import Correction
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX, Debias
from vllm.entrypoints.generate.decisions.decide.temperature import (
    Temperature,
    Temperatures,
)


@dataclass(frozen=True)
class Calibrated:
    """What startup calibration gives the server: its temperatures and each type's reads, and what
    they were fitted on (the audit's ``calibration_stage`` and ``calibration_reads``): ``stage`` is
    FIRST_PASS while the full calibration runs on, FULL after (None: nothing was calibrated), and
    ``question_reads`` the labelled question reads answered (None for a record saved before it was
    counted)."""

    temperatures: Temperatures
    reads: Mapping[str, TypeReads] = field(default_factory=dict)
    stage: str | None = None
    question_reads: int | None = None
    # Questions' own maps from the operator's labels, by bias.question_key.
    maps: Mapping[str, QuestionMap] = field(default_factory=dict)
    # Each question type's confidence threshold, where the operator asked it a precision.
    abstention: Mapping[str, Abstention] = field(default_factory=dict)
    # How many times the labels file the server watches has refitted ``maps`` (0: startup's maps).
    maps_version: int = 0
    # The saved calibration record's key (None: none saved): run-time maps are saved under it.
    key: Mapping[str, Any] | None = None
    # Questions' kept in-context examples (with the map fitted on reads with them), by question key.
    examples: Mapping[str, QuestionExamples] = field(default_factory=dict)
    # The confidence threshold of each question the operator asked a precision of, by question key.
    question_abstention: Mapping[str, Abstention] = field(default_factory=dict)
    # Startup's labelled reads (CalibrationRecord.labelled), which a labels file's refit pools with.
    labelled: tuple[LabelledRead, ...] = ()

    def abstention_for(
        self, question: CompiledQuestion, examples: QuestionExamples | None = None
    ) -> Abstention | None:
        """The rule an answer to ``question`` is judged by (``examples``: the ones it was read
        with): where the operator asked the question a precision, its own, fitted on answers read
        as this one was; else its type's (None: no precision asked)."""
        if examples is not None and examples.abstention is not None:
            return examples.abstention
        if self.question_abstention:
            own = self.question_abstention.get(question_key(question))
            if own is not None:
                return own
        return self.abstention.get(question.qtype.name)


@dataclass(frozen=True)
class Asked:
    """What a request asked of its reads (None: the server's choice): ``extra.debias``, ``extra.prior``
    and the label layout its ``extra.backend_options`` name."""

    debias: Debias
    prior: PriorSetting | None = None
    layout: str | None = None


@dataclass(frozen=True)
class Resolved:
    """How one question is read: the correction, the layout laid over the backend's options (None: as
    the request has them), the temperature, and the question's own map where one applies."""

    correction: Correction
    layout: str | None
    temperature: Temperature
    question_map: QuestionMap | None = None
    # The question's kept in-context examples (then ``question_map`` is the map fitted with them).
    examples: QuestionExamples | None = None


class Corrections:
    """The server's prior setting, calibration's choices, and the content-free reads shared by every
    request (cached per question fingerprint)."""

    def __init__(
        self, setting: PriorSetting, cache_size: int, cache_bytes: int | None = None
    ) -> None:
        self.setting = setting
        self.cache = PriorCache(cache_size, cache_bytes)
        self.reads: Mapping[str, TypeReads] = {}

    def resolve(
        self,
        question: CompiledQuestion,
        asked: Asked,
        temperatures: Temperatures,
        requested_t: float | None,
        calibrated: bool = True,
        chosen_reads: Mapping[str, TypeReads] | None = None,
        maps: Mapping[str, QuestionMap] | None = None,
        examples: Mapping[str, QuestionExamples] | None = None,
    ) -> Resolved:
        """How ``question`` is read; ``calibrated``: by the backend calibration measured; ``chosen_reads``,
        ``maps`` and ``examples``: the calibration's choices, question maps and kept in-context examples
        the request took when it began (else this object's reads and none)."""
        qtype = question.qtype.name
        in_force = self.reads if chosen_reads is None else chosen_reads
        reads = in_force.get(qtype) if calibrated else None
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
        applied = temperatures.applied(qtype, requested_t)
        chosen = reads is not None and choice is reads.chosen and mode == choice.mode
        if (
            applied.source == "calibrated"
            and reads is not None
            and candidate is not None
            and not chosen
        ):
            scope = ":".join(
                part for part in (qtype, "question" if own else layout, mode) if part
            )
            applied = Temperature(candidate.temperature, "calibrated", scope)
        laid = layout if asked.layout is None and reads is not None else None
        # A question's own map (and its examples) were fitted on its scores as calibration chose to
        # read them, so they apply to those reads only, and a T set by the request or the operator
        # overrides them.
        correction = Correction(mode, self.cache, bias)
        if not (
            key is not None
            and reads is not None
            and layout == reads.layout
            and choice is not None
            and mode == choice.mode
            and applied.source == "calibrated"
        ):
            return Resolved(correction, laid, applied)
        if (shown := (examples or {}).get(key)) is not None:
            applied = Temperature(
                1.0 / shown.map.scale, "calibrated", f"{qtype}:examples"
            )
            return Resolved(correction, laid, applied, shown.map, shown)
        if (own_map := (maps or {}).get(key)) is not None:
            applied = Temperature(
                1.0 / own_map.scale, "calibrated", f"{qtype}:question"
            )
            return Resolved(correction, laid, applied, own_map)
        return Resolved(correction, laid, applied)
