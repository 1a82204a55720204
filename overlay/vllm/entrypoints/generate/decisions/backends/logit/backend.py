# SPDX-License-Identifier: Apache-2.0
"""The logit backend's read: one forward pass, log-probabilities of the option letters."""

from __future__ import annotations

import math

from pydantic import BaseModel

from ...errors import DecisionError
from ...host import BackendHost
from ...questions import CompiledQuestion
from ..base import DecisionBackend, Reading
from .answer_slot import AnswerSlotPlacer
from .prompt import RENDER_VERSION, messages, option_letters

DIRECT_CAPACITY = 26


class LogitBackend(DecisionBackend):
    name = "logit"
    render_version = RENDER_VERSION

    def __init__(self, host: BackendHost, options: BaseModel | None = None) -> None:
        super().__init__(host, options)
        self.slot = AnswerSlotPlacer(host)

    async def read(self, state: str, question: CompiledQuestion, request_id: str) -> Reading:
        count = len(question.options)
        if count > DIRECT_CAPACITY:
            raise DecisionError(
                f"this question has {count} options; the logit backend's direct readout reads at most "
                f"{DIRECT_CAPACITY} (one letter each)"
            )
        letters = option_letters(count)
        rendered = await self.host.render_chat(messages(state, question, letters))
        slot = self.slot.place(rendered, letters)
        limit = self.host.max_model_len
        if len(slot.prompt_ids) >= limit:
            raise DecisionError(
                f"the rendered prompt has {len(slot.prompt_ids)} tokens; the model's context "
                f"(--max-model-len {limit}) leaves room for at most {limit - 1}"
            )
        read = await self.host.read_token_logprobs(slot.prompt_ids, slot.label_ids, request_id)
        scores = [read.logprobs[token] for token in slot.label_ids]
        return Reading(
            scores=scores,
            forward_passes=1,
            input_tokens=read.prompt_tokens,
            cached_input_tokens=read.cached_tokens,
            readout="direct",
            option_mass=sum(math.exp(s) for s in scores),
            audit={"label_layout": "direct"},
        )
