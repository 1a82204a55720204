# SPDX-License-Identifier: Apache-2.0
"""The words for a prior correction (prior.py in reading/), defined once: settings, the wires and
calibration all validate against these."""

from __future__ import annotations

from typing import Literal, get_args

# The corrections, and what VLLM_TYPED_DECISIONS_PRIOR and a request's ``extra.prior``
# accept: one of them or auto (calibration's choice per question type).
PriorMode = Literal["off", "content-free", "fitted", "content-free+fitted"]
PriorSetting = Literal["auto", PriorMode]
MODES: tuple[PriorMode, ...] = get_args(PriorMode)
PRIOR_CHOICES: tuple[PriorSetting, ...] = get_args(PriorSetting)
AUTO: PriorSetting = "auto"


def uses_content_free(mode: str) -> bool:
    return mode.startswith("content-free")


def uses_fitted(mode: str) -> bool:
    return mode.endswith("fitted")
