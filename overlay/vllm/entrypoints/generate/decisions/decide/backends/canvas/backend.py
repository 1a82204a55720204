# SPDX-License-Identifier: Apache-2.0
"""The canvas backend: DiffusionGemma reads the answer slot of a seeded, read-only canvas.

After the logit backend's prompt, the canvas holds a noise token at the answer slot, then the
turn-close marker; ``samples=n`` averages n canvases whose noise comes from one seed."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.errors import (
    BackendUnavailable,
    DecisionError,
)
from vllm.entrypoints.generate.decisions.decide.host import BackendHost, TokenRead
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.chat_template import (
    takes_system_role,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
    MARKERS,
    LabelCatalog,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    RENDER_VERSION,
    messages,
)
from vllm.entrypoints.generate.decisions.decide.questions import (
    CompiledQuestion,
    top_index,
)
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.scoring import softmax
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

# The canvas: the answer slot, then the turn-close marker.
CANVAS_WIDTH = 2
MAX_SAMPLES = 64
# What the startup probe has the assistant say, to find the token the template closes a turn with.
_PROBE_REPLY = "The answer is B."


# Set at startup (VLLM_TYPED_DECISIONS_BACKEND=canvas:samples=5), overridable per request
# (extra.backend_options; extra.seed sets seed).
class CanvasOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # How many noise draws (canvas reads) to average per question; each is one more read.
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    # The most denoising steps one read may take (1: the first denoise's distribution).
    max_steps: int = Field(default=1, ge=1)
    # Fixes the noise draws; None draws a fresh seed for each request (reported either way).
    seed: int | None = Field(default=None, ge=0, lt=2**63)


class SampleFacts(BaseModel):
    n: int
    # Per option: the standard error of its probability over the samples.
    stderr: dict[str, float]
    # The share of samples whose top option is the averaged top option.
    agreement: float


class CanvasFacts(BaseModel):
    """What each answer's ``extra.backend`` says about its canvas reads."""

    seed: int
    samples: SampleFacts
    canvas_width: int
    max_steps: int


class CanvasBackend(DecisionBackend[CanvasOptions]):
    name = "canvas"
    architectures = ("DiffusionGemmaForBlockDiffusion",)
    options_model = CanvasOptions
    render_version = RENDER_VERSION

    def __init__(
        self,
        host: BackendHost,
        options: CanvasOptions | None = None,
        settings: Settings | None = None,
    ) -> None:
        super().__init__(host, options or CanvasOptions(), settings)
        self.placer = AnswerSlotPlacer(host)
        self.catalog = LabelCatalog(tuple(MARKERS), ())
        self.turn_close: int | None = None
        self.system_role = True

    def seeded(self, options: CanvasOptions, seed: int | None) -> CanvasOptions:
        return options if seed is None else options.model_copy(update={"seed": seed})

    async def start(self) -> None:
        if not self.host.canvas_reads:
            # vLLM 0.32 reads canvases itself; 0.30 needs our patch.
            patch = " on a vLLM with patches/00572-diffusion-canvas-read-v0.30.patch (./install.sh --with-canvas)"
            raise BackendUnavailable(
                "this server can't do read-only canvas reads: the canvas backend needs a diffusion model "
                f"(DiffusionGemma){'' if BUILT_IN_CANVAS_READ else patch}"
            )
        if self.host.vocab_size <= 0:
            raise BackendUnavailable(
                "the engine did not say its vocabulary size, which the canvas noise is drawn from"
            )
        self.system_role = await takes_system_role(self.host)
        self.turn_close = await turn_close_id(self.host)
        logger.info(
            "canvas backend: turn-close token %d, %s", self.turn_close, self.options
        )

    async def read(
        self, question: CompiledQuestion, context: ReadContext[CanvasOptions]
    ) -> Reading:
        options, turn_close = context.options or self.options, self.turn_close
        if turn_close is None:
            raise DecisionError(
                "the canvas backend has not started", HTTPStatus.SERVICE_UNAVAILABLE
            )
        count, markers = len(question.options), len(self.catalog.markers)
        if count > markers:
            raise DecisionError(
                f"{count} options; the canvas backend reads directly, at most {markers} (one letter each)"
            )
        labels = self.catalog.labels(count)
        slot = self.placer.place(
            await self.host.render_chat(
                messages(context.state, question, labels, self.system_role)
            ),
            labels,
        )
        limit = self.host.max_model_len
        if len(slot.prompt_ids) + CANVAS_WIDTH > limit:
            raise DecisionError(
                f"the rendered prompt has {len(slot.prompt_ids)} tokens and its canvas {CANVAS_WIDTH}; the "
                f"model's context (--max-model-len {limit}) holds {limit}"
            )
        seed = options.seed if options.seed is not None else random.randrange(2**63)
        noise = noise_tokens(seed, options.samples, self.host.vocab_size)

        def canvas_read(index: int) -> Any:
            return self.host.read_canvas(
                slot.prompt_ids,
                [noise[index], turn_close],
                slot.label_ids,
                options.max_steps,
                context.part(f"c{index}"),
            )

        # The first read puts the prompt in the prefix cache; the others then read it from there.
        reads = [await canvas_read(0)]
        reads += await gather_or_cancel(
            canvas_read(i) for i in range(1, options.samples)
        )
        scores = [label_scores(read, slot.label_ids) for read in reads]
        together = average([softmax(s) for s in scores])
        keys = [o.key for o in question.options]
        return Reading(
            scores=[
                math.log(p) if p > 0 else -math.inf for p in together.probabilities
            ],
            forward_passes=options.samples * options.max_steps,
            input_tokens=sum(r.prompt_tokens for r in reads),
            cached_input_tokens=sum(r.cached_tokens for r in reads),
            readout="direct",
            option_mass=sum(sum(math.exp(v) for v in s) for s in scores) / len(scores),
            meta=CanvasFacts(
                seed=seed,
                samples=SampleFacts(
                    n=options.samples,
                    stderr=dict(zip(keys, together.stderr, strict=True)),
                    agreement=together.agreement,
                ),
                canvas_width=CANVAS_WIDTH,
                max_steps=options.max_steps,
            ),
        )


def label_scores(read: TokenRead, label_ids: list[int]) -> list[float]:
    if missing := [t for t in label_ids if t not in read.logprobs]:
        raise DecisionError(
            f"the canvas read lacked {len(missing)} of {len(label_ids)} label log-probabilities",
            HTTPStatus.INTERNAL_SERVER_ERROR,
        )
    return [read.logprobs[t] for t in label_ids]


async def turn_close_id(host: BackendHost) -> int:
    """The special token the chat template closes an assistant turn with: the canvas ends on it."""
    chat = [
        {"role": "user", "content": "Which letter?"},
        {"role": "assistant", "content": _PROBE_REPLY},
    ]
    text = await host.render_chat_text(chat)
    if text is None or _PROBE_REPLY not in text:
        raise BackendUnavailable(
            "could not render an assistant turn to find the template's turn-close marker"
        )
    after = host.encode(text[text.rindex(_PROBE_REPLY) + len(_PROBE_REPLY) :])
    if not after or after[0] not in host.special_token_ids():
        raise BackendUnavailable(
            "the chat template closes an assistant turn with no special token; the canvas needs one"
        )
    return after[0]


def noise_tokens(seed: int, count: int, vocab_size: int) -> list[int]:
    """``count`` noise tokens, uniform over the vocabulary (as the engine draws a fresh canvas), fixed by
    ``seed`` alone, so the same seed gives the same canvases on any host."""
    draw = random.Random(seed)
    return [draw.randrange(vocab_size) for _ in range(count)]


@dataclass(frozen=True)
class Average:
    probabilities: list[float]
    # The standard error of each option's mean probability (0 for one sample).
    stderr: list[float]
    agreement: float  # as SampleFacts.agreement


def average(distributions: Sequence[Sequence[float]]) -> Average:
    n, columns = len(distributions), list(zip(*distributions, strict=True))
    means = [sum(column) / n for column in columns]
    stderr = [
        math.sqrt(sum((p - mean) ** 2 for p in column) / (n - 1) / n) if n > 1 else 0.0
        for column, mean in zip(columns, means, strict=True)
    ]
    top = top_index(means)
    return Average(means, stderr, sum(top_index(d) == top for d in distributions) / n)
