# SPDX-License-Identifier: Apache-2.0
"""Which read answers a question, and the reads themselves: direct (one label per option, one pass),
wide-direct (single-token marker pairs add labels), two-stage (each option alone as yes/no, then the
leaders through a direct read, sharing their stage-1 mass). ``auto`` takes the first that fits; an
exact read past the engine's token-id cap becomes a top-k read rather than failing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from vllm.entrypoints.generate.decisions.decide.backends.base import Reading
from vllm.entrypoints.generate.decisions.decide.backends.logit.options import (
    LogitOptions,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.precision import (
    read_precision,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.reads import (
    LabelRead,
    ReadAudit,
    read_exact,
    read_top_k,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.stencil import (
    StencilPool,
)
from vllm.entrypoints.generate.decisions.decide.concurrency import gather_or_cancel
from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    OverLimitError,
)
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlot,
    AnswerSlotPlacer,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
    LabelCatalog,
    word_labels,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import (
    Shown,
    frame_for,
    option_check,
    question_text,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import Example, ReadContext
from vllm.entrypoints.generate.decisions.decide.scoring import softmax


@dataclass(frozen=True)
class Plan:
    readout: str
    logprobs: str


def plan(
    count: int, options: LogitOptions, catalog: LabelCatalog, token_id_cap: int
) -> Plan:
    """The read for ``count`` options under ``options``; refuses a read that can't hold them."""
    markers, wide = len(catalog.markers), catalog.wide_capacity
    mode = options.logprobs
    fits = mode == "top-k" or count <= token_id_cap
    if options.readout == "auto":
        if count <= markers and fits:
            return Plan("direct", mode)
        if count <= wide:
            return Plan("wide-direct", mode if fits else "top-k")
        return Plan("two-stage", mode)
    if options.readout == "direct" and count > markers:
        raise DecisionError(
            f"{count} options; the direct readout reads at most {markers} (one marker each)"
        )
    if options.readout == "wide-direct" and count > wide:
        raise DecisionError(
            f"{count} options; wide-direct reads at most {wide} on this tokenizer "
            f"({markers} markers + {len(catalog.pairs)} single-token pairs)"
        )
    if options.readout != "two-stage" and not fits:
        raise DecisionError(
            f"{count} options in one exact read: MAX_LOGPROB_TOKEN_IDS in vllm/sampling_params.py caps an "
            f"exact read at {token_id_cap} labels: apply patches/max-logprob-token-ids-v0.30.patch to raise "
            "it, or ask for logprobs=top-k"
        )
    return Plan(options.readout, mode)


@dataclass(frozen=True)
class LabelledSlot:
    slot: AnswerSlot
    labels: list[str]
    # What extra.audit.label_layout says: "words", "markers" or "markers+pairs".
    layout: str


async def labelled_slot(
    prompts: StencilPool,
    placer: AnswerSlotPlacer,
    catalog: LabelCatalog,
    state: str,
    question: CompiledQuestion,
    words: bool = False,
    examples: Sequence[Example] = (),
) -> LabelledSlot:
    """The prompt and label tokens of one read: in the question's words where asked and each is one
    token at its answer slot, else in letters; ``examples`` answered in the same labels."""
    if words and (labels := word_labels(question)) is not None:
        body = question_text(question, labels, words=True)
        rendered = await prompts.prompt_ids(
            state,
            body,
            shown(examples, question, body, labels),
            frame_for(question, words=True),
        )
        slot = placer.place_words(rendered, labels)
        if slot is not None:
            return LabelledSlot(slot, labels, "words")
    labels = catalog.labels(len(question.options))
    body = question_text(question, labels)
    rendered = await prompts.prompt_ids(
        state, body, shown(examples, question, body, labels)
    )
    return LabelledSlot(
        placer.place(rendered, labels), labels, LabelCatalog.layout(labels)
    )


def shown(
    examples: Sequence[Example],
    question: CompiledQuestion,
    body: str,
    labels: Sequence[str],
) -> list[Shown]:
    keys = [option.key for option in question.options]
    return [
        Shown(example.state, body, labels[keys.index(example.answer)])
        for example in examples
    ]


@dataclass
class ReadoutRunner:
    host: BackendHost
    placer: AnswerSlotPlacer
    catalog: LabelCatalog
    prompts: StencilPool
    # Whether reads asking for fp32 or words get them (their startup checks passed).
    fp32_reads: bool = False
    word_reads: bool = True

    async def labelled_read(
        self,
        question: CompiledQuestion,
        mode: str,
        context: ReadContext[Any],
        fallback: bool = True,
        fp32: bool = False,
        words: bool = False,
    ) -> tuple[LabelRead, str]:
        """The read of ``question`` about ``context.state`` and the label layout used."""
        chosen = await labelled_slot(
            self.prompts,
            self.placer,
            self.catalog,
            context.state,
            question,
            words,
            context.examples,
        )
        slot, labels = chosen.slot, chosen.labels
        limit = self.host.max_model_len
        if len(slot.prompt_ids) >= limit:
            raise OverLimitError(
                f"the rendered prompt has {len(slot.prompt_ids)} tokens; the model's context "
                f"(--max-model-len {limit}) leaves room for at most {limit - 1}"
            )
        args = (self.host, slot.prompt_ids, labels, slot.label_ids, context)
        if mode == "exact":
            return await read_exact(*args, fallback, fp32), chosen.layout
        return await read_top_k(*args, fp32), chosen.layout

    async def run(
        self, plan: Plan, question: CompiledQuestion, context: ReadContext[LogitOptions]
    ) -> Reading:
        options = context.options
        fp32 = options.precision == "float32" and self.fp32_reads
        if plan.readout == "two-stage":
            # Its reads ask other questions (each option alone, then a shortlist): no examples fit them.
            read, layout = await self.two_stage(
                question,
                plan.logprobs,
                options.shortlist,
                context.with_examples(()),
                fp32,
            )
        else:
            words = (
                options.labels == "words"
                and plan.readout == "direct"
                and self.word_reads
            )
            read, layout = await self.labelled_read(
                question, plan.logprobs, context, fp32=fp32, words=words
            )
        return Reading(
            scores=read.scores,
            forward_passes=read.forward_passes,
            input_tokens=read.input_tokens,
            cached_input_tokens=read.cached_tokens,
            readout=plan.readout,
            option_mass=read.option_mass,
            meta=read.facts,
            audit=ReadAudit(
                label_layout=layout, logit_precision=read_precision(self.host, fp32)
            ),
        )

    async def two_stage(
        self,
        question: CompiledQuestion,
        mode: str,
        shortlist: int,
        context: ReadContext[Any],
        fp32: bool = False,
    ) -> tuple[LabelRead, str]:
        # Stage 1: each option alone, as yes/no. Exact reads here have no fallback.
        checks = [
            self.labelled_read(
                option_check(question, option),
                mode,
                context.part(f"s1-{i}"),
                False,
                fp32,
            )
            for i, option in enumerate(question.options)
        ]
        stage1 = [read for read, _ in await gather_or_cancel(checks)]
        p_yes = [softmax(r.scores)[0] for r in stage1]
        total = sum(p_yes)
        first = [p / total for p in p_yes]
        leaders = sorted(
            sorted(range(len(first)), key=lambda i: (-first[i], i))[:shortlist]
        )
        finals = replace(question, options=tuple(question.options[i] for i in leaders))
        final, layout = await self.labelled_read(
            finals, mode, context.part("s2"), fp32=fp32
        )
        shared = sum(first[i] for i in leaders)
        probabilities = list(first)
        for i, p in zip(leaders, softmax(final.scores), strict=True):
            probabilities[i] = shared * p
        keys = [o.key for o in question.options]
        reads = [*stage1, final]
        return LabelRead(
            scores=[math.log(p) if p > 0 else -math.inf for p in probabilities],
            option_mass=final.option_mass,
            forward_passes=sum(r.forward_passes for r in reads),
            input_tokens=sum(r.input_tokens for r in reads),
            cached_tokens=sum(r.cached_tokens for r in reads),
            facts=final.facts.model_copy(
                update={
                    "stage1_scores": {
                        keys[i]: math.log(p) if p > 0 else None
                        for i, p in enumerate(p_yes)
                    },
                    "shortlist": [keys[i] for i in leaders],
                }
            ),
        ), layout
