# SPDX-License-Identifier: Apache-2.0
"""The canvas backend for DiffusionGemma (DiffusionGemmaForBlockDiffusion, patches/00572)."""

from vllm.entrypoints.generate.decisions.decide.backends.canvas.backend import (
    CanvasBackend,
)

__all__ = ["CanvasBackend"]
