# SPDX-License-Identifier: Apache-2.0
"""The logit backend's options: set at startup (``VLLM_TYPED_DECISIONS_BACKEND=logit:readout=...``)
and overridable per request (``extra.backend_options``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
    MARKERS,
    LabelLayout,
)

Readout = Literal["auto", "direct", "wide-direct", "two-stage"]
LogprobMode = Literal["top-k", "exact"]
Precision = Literal["float32", "model"]


class LogitOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # auto: the first read that fits, in this order: direct, wide-direct, two-stage.
    readout: Readout = "auto"
    # top-k: vLLM's plain top-k list (window = --max-logprobs); exact: logprob_token_ids.
    logprobs: LogprobMode = "top-k"
    # float32: option log-probabilities recomputed in fp32 under a bf16/fp16 LM head, where the engine
    # can (patches/exact-logprobs); model: the LM head's own dtype.
    precision: Precision = "float32"
    # How many stage-1 leaders a two-stage read sends to its final direct read.
    shortlist: int = Field(default=8, ge=2, le=26)
    # One option label per character; pairs of them make the wide-direct labels.
    markers: str = MARKERS
    # words: each option's own word in direct reads, where each is one token at the answer slot and
    # the startup check passed; letters otherwise (extra.audit.label_layout says which).
    labels: LabelLayout = "letters"

    @field_validator("markers")
    @classmethod
    def _distinct_visible(cls, markers: str) -> str:
        if (
            len(markers) < 2
            or len(set(markers)) != len(markers)
            or any(c.isspace() for c in markers)
        ):
            raise ValueError(
                "markers must be at least 2 distinct, non-space characters"
            )
        return markers
