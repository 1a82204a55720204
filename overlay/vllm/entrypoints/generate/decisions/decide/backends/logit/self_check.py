# SPDX-License-Identifier: Apache-2.0
"""The startup self-check: does the model's next token land on the option letters of easy probes?

Below the threshold the model is about to write something else first; the check then tries each empty
reasoning block the tokenizer supports. Letters are what every question falls back to, so they decide
the check; the words layout's mass only decides whether reads asking for words get them."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.entrypoints.generate.decisions.decide.backends.logit.readouts import (
    labelled_slot,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.reads import read_exact
from vllm.entrypoints.generate.decisions.decide.backends.logit.stencil import (
    StencilPool,
)
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
    supported_reasoning_blocks,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import LabelCatalog
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    NOUL,
    ChoiceQuestion,
    NoulQuestion,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext

PROBES = (
    (
        "The sky is blue and the sun is shining.",
        NOUL.compile(NoulQuestion(instructions="Is the sun shining?")),
    ),
    (
        "Paris is the capital of France.",
        CHOICE.compile(
            ChoiceQuestion(
                instructions="What is the capital of France?",
                criteria={"Berlin": None, "Paris": None, "Rome": None},
            )
        ),
    ),
)


@dataclass(frozen=True)
class SelfCheck:
    passed: bool
    reasoning_block: str
    option_mass: float
    tried: tuple[tuple[str, float], ...]

    def failure(self, minimum: float, variable: str) -> str:
        attempts = ", ".join(
            f"{block or 'no block'!r}: {mass:.3f}" for block, mass in self.tried
        )
        return (
            f"the model's next token is not an option letter: at most {self.option_mass:.3f} of its next-token "
            f"probability lands on the letters, below {minimum} ({variable}); tried {attempts}"
        )


async def probe_mass(
    host: BackendHost,
    prompts: StencilPool,
    placer: AnswerSlotPlacer,
    catalog: LabelCatalog,
    words: bool = False,
) -> float | None:
    """The probes' mean option mass read in letters, or (``words``) over the probes whose words fit
    (None: none do)."""
    masses = []
    for i, (state, question) in enumerate(PROBES):
        chosen = await labelled_slot(prompts, placer, catalog, state, question, words)
        if words and chosen.layout != "words":
            continue
        slot, labels = chosen.slot, chosen.labels
        context = ReadContext.about(
            state, f"decision-self-check-{'words-' if words else ''}{i}"
        )
        read = await read_exact(host, slot.prompt_ids, labels, slot.label_ids, context)
        masses.append(read.option_mass)
    return sum(masses) / len(masses) if masses else None


async def self_check(
    host: BackendHost,
    prompts: StencilPool,
    placer: AnswerSlotPlacer,
    catalog: LabelCatalog,
    minimum: float,
) -> SelfCheck:
    """Find the answer slot: no block, then each supported empty reasoning block; leaves the
    winning block (or the best) set on ``placer``."""
    tried: list[tuple[str, float]] = []
    for block in ["", *supported_reasoning_blocks(host)]:
        placer.reasoning_block = block
        mass = await probe_mass(host, prompts, placer, catalog) or 0.0
        tried.append((block, mass))
        if mass >= minimum:
            return SelfCheck(True, block, mass, tuple(tried))
    best_block, best = max(tried, key=lambda t: t[1])
    placer.reasoning_block = best_block
    return SelfCheck(False, best_block, best, tuple(tried))
