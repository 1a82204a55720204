# SPDX-License-Identifier: Apache-2.0
"""The encoder backend: Laya decision models score every option of a question in one pooling pass."""

from __future__ import annotations

import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from vllm.entrypoints.generate.decisions.decide.backends.base import (
    DecisionBackend,
    Reading,
)
from vllm.entrypoints.generate.decisions.decide.backends.encoder.checkpoint import (
    LAYA_TYPES,
    LayaConfig,
    PromptBuilder,
    load_prompt_builder,
    read_laya_config,
)
from vllm.entrypoints.generate.decisions.decide.backends.encoder.laya_prompts import (
    PROMPT_VERSION,
)
from vllm.entrypoints.generate.decisions.decide.errors import (
    BackendUnavailable,
    DecisionError,
)
from vllm.entrypoints.generate.decisions.decide.questions import CompiledQuestion
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.logger import init_logger

logger = init_logger(__name__)

# What Laya's noul options say when the question gives no criterion.
NOUL_DEFAULTS = {
    "false": "no, the statement does not hold",
    "true": "yes, the statement holds",
}


class EncoderFacts(BaseModel):
    """What each answer's ``extra.backend`` says about the encoder's read."""

    # Which Laya prompt builder wrote the prompt: the checkpoint's own or the built-in one.
    prompt_source: str
    act_scores: list[float]
    checkpoint_temperature: float | None


class EncoderBackend(DecisionBackend[None]):
    name = "encoder"
    architectures = ("LayaForDecision",)
    render_version = PROMPT_VERSION

    _config: LayaConfig | None = None
    _builder: PromptBuilder | None = None

    async def start(self) -> None:
        config, builder = read_laya_config(self.host), load_prompt_builder(self.host)
        tokenizer = self.host.tokenizer
        if getattr(tokenizer, "mask_token_id", None) != config.mask_token_id:
            raise BackendUnavailable(
                f"the tokenizer's [MASK] is {getattr(tokenizer, 'mask_token_id', None)}, "
                f"laya_config.mask_token_id is {config.mask_token_id}: the model would find no option markers"
            )
        # The model picks a question's type embedding by the token after [CLS].
        for qtype in LAYA_TYPES:
            ids, _ = builder.build(
                tokenizer,
                "x",
                qtype,
                "x",
                ["a", "b"],
                max_len=config.max_len,
                head_max_len=config.head_max_len,
                option_max_tokens=config.option_max_tokens,
            )
            if len(ids) < 2 or ids[1] != config.question_type_token_ids[qtype]:
                raise BackendUnavailable(
                    f"{builder.source} Laya prompts for {qtype} questions start with token "
                    f"{ids[1:2]}, but laya_config.question_type_token_ids names "
                    f"{config.question_type_token_ids[qtype]}: prompts and checkpoint disagree"
                )
        self._config, self._builder = config, builder
        logger.info(
            "encoder backend: Laya prompts %s (%s), max_len %d, head_max_len %d",
            config.prompt_version,
            builder.source,
            self._max_len(config),
            config.head_max_len,
        )

    def _max_len(self, config: LayaConfig) -> int:
        return min(config.max_len, self.host.max_model_len)

    async def read(
        self, question: CompiledQuestion, context: ReadContext[None]
    ) -> Reading:
        config, builder, state = self._config, self._builder, context.state
        if config is None or builder is None:
            raise DecisionError(
                "the encoder backend has not started", HTTPStatus.SERVICE_UNAVAILABLE
            )
        qtype = question.qtype.name
        if qtype not in LAYA_TYPES:
            raise DecisionError(
                f"the encoder backend answers {', '.join(sorted(LAYA_TYPES))} questions; {qtype!r} is not one of them"
            )
        count = len(question.options)
        if count > config.max_options:
            raise DecisionError(
                f"the question has {count} options; this checkpoint marks at most {config.max_options} "
                "(laya_config.max_options)"
            )
        layout = laya_options(question)
        try:
            ids, markers = builder.build(
                self.host.tokenizer,
                state,
                qtype,
                question.instructions,
                layout.texts,
                max_len=self._max_len(config),
                head_max_len=config.head_max_len,
                option_max_tokens=config.option_max_tokens,
            )
        except ValueError as exc:
            raise DecisionError(str(exc)) from None
        if len(markers) != count:
            raise DecisionError(
                f"the {builder.source} prompt builder marked {len(markers)} of {count} options",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        values = _flat(await self.host.pool(ids, "token_classify", context))
        if len(values) != count + config.act_size:
            raise DecisionError(
                f"the model returned {len(values)} values for {count} options and {config.act_size} act scores",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        return Reading(
            scores=layout.in_question_order(values[:count]),
            forward_passes=1,
            input_tokens=len(ids),
            cached_input_tokens=0,
            readout="direct",
            meta=EncoderFacts(
                prompt_source=builder.source,
                act_scores=values[count:],
                checkpoint_temperature=config.checkpoint_temperature(qtype, count),
            ),
        )


def _flat(output: Any) -> list[float]:
    """The pooling output as one list of floats (NaN kept: the service refuses it)."""
    while isinstance(output, list) and len(output) == 1 and isinstance(output[0], list):
        output = output[0]
    if not isinstance(output, list):
        return []
    return [
        float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan
        for v in output
    ]


@dataclass(frozen=True)
class LayaOptions:
    texts: list[str]
    # slots[i]: the slot (marker) of the question's i-th option
    slots: list[int]

    def in_question_order(self, slot_scores: list[float]) -> list[float]:
        return [slot_scores[slot] for slot in self.slots]


def laya_options(question: CompiledQuestion) -> LayaOptions:
    """Options as Laya renders them: noul lists false before true; score levels read ``level i: ...``."""
    options = question.options
    if question.qtype.name == "noul":
        order = ["false", "true"]
        described = {o.key: o.description for o in options}
        texts = [f"{key}: {described.get(key) or NOUL_DEFAULTS[key]}" for key in order]
        return LayaOptions(texts, [order.index(o.key) for o in options])
    score = question.qtype.name == "score"
    texts = [f"level {i}: {o.text}" if score else o.text for i, o in enumerate(options)]
    return LayaOptions(texts, list(range(len(options))))
