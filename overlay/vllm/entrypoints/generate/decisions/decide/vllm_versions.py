# SPDX-License-Identifier: Apache-2.0
"""What differs between the vLLM versions this overlay installs into (0.30 and 0.32), named once;
tests/install/test_vllm_imports.py checks every other ``vllm`` import against each version."""

from __future__ import annotations

from typing import Any

import vllm

_MAJOR, _MINOR = vllm.__version__.split(".")[:2]
VLLM_RELEASE = (int(_MAJOR), int(_MINOR))
# vLLM 0.32 answers POST /v1/systemone itself (vllm/entrypoints/generate/structured_decisions) on every
# server; with decisions on, this overlay takes the path over (api_router.py).
UPSTREAM_SYSTEMONE = VLLM_RELEASE >= (0, 32)
# vLLM 0.32 reads a DiffusionGemma canvas without changing it (its ``diffusion_*`` sampling arguments);
# 0.30 needs patches/00572-diffusion-canvas-read-v0.30.patch.
BUILT_IN_CANVAS_READ = VLLM_RELEASE >= (0, 32)


def load_chat_template(template: str | None) -> Any:
    """vLLM's ``--chat-template`` loader."""
    if VLLM_RELEASE >= (0, 32):
        from vllm.renderers.chat_utils import load_chat_template as load
    else:
        from vllm.entrypoints.chat_utils import load_chat_template as load
    return load(template)
