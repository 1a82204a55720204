"""Plugins that misbehave on purpose, so the tests can show the server survives them.

``FaultyBackend`` answers by its question's instructions: ``raise`` raises, ``nan`` returns NaN,
``short`` returns one score too few, anything else two honest scores. ``broken`` fails to import when
``DECISIONS_TEST_PLUGIN_BROKEN`` is set.
"""

from __future__ import annotations

import math
import os
from typing import Any

from vllm.entrypoints.generate.decisions import (
    CompiledQuestion,
    DecisionBackend,
    Reading,
)


class FaultyBackend(DecisionBackend):
    name = "faulty"
    render_version = "faulty-1"

    async def read(
        self,
        state: str,
        question: CompiledQuestion,
        request_id: str,
        options: Any = None,
    ) -> Reading:
        count = len(question.options)
        scores = {
            "nan": [math.nan] * count,
            "short": [-1.0] * (count - 1),
        }.get(question.instructions, [-0.5] + [-1.5] * (count - 1))
        if question.instructions == "raise":
            raise RuntimeError("the faulty plugin raised on purpose")
        return Reading(
            scores=scores,
            forward_passes=0,
            input_tokens=0,
            cached_input_tokens=0,
            readout="faulty",
        )


def register_broken() -> None:
    """The ``broken`` entry point: fails when the variable is set, registers nothing otherwise."""
    if os.environ.get("DECISIONS_TEST_PLUGIN_BROKEN"):
        raise ImportError(
            "this plugin is broken on purpose (DECISIONS_TEST_PLUGIN_BROKEN is set)"
        )
