# SPDX-License-Identifier: Apache-2.0
"""The default backend: next-token log-probabilities over option letters, for any generative model."""

from vllm.entrypoints.generate.decisions.decide.backends.logit.backend import (
    LogitBackend,
)

__all__ = ["LogitBackend"]
