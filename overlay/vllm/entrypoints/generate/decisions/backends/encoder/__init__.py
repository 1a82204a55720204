# SPDX-License-Identifier: Apache-2.0
"""The encoder backend for Laya decision models (LayaForDecision, a token_classify pooling model)."""

from .backend import EncoderBackend

__all__ = ["EncoderBackend"]
