# SPDX-License-Identifier: Apache-2.0
"""The canvas backend's options: set at startup (``VLLM_TYPED_DECISIONS_BACKEND=canvas:samples=5``) and
overridable per request (``extra.backend_options``; ``extra.seed`` sets ``seed``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# Each sample is one more canvas read per question.
MAX_SAMPLES = 64


class CanvasOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # How many noise draws (canvas reads) to average per question.
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    # The most denoising steps one read may take (1: the first denoise's distribution).
    max_steps: int = Field(default=1, ge=1)
    # Fixes the noise draws; None draws a fresh seed for each request (reported either way).
    seed: int | None = Field(default=None, ge=0, lt=2**63)
