# SPDX-License-Identifier: Apache-2.0
"""The encoder backend for Laya decision models (LayaForDecision, a token_classify pooling model)."""

from vllm.entrypoints.generate.decisions.decide.backends.encoder.backend import (
    EncoderBackend,
)

__all__ = ["EncoderBackend"]
