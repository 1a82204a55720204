"""What the template matrix checks for one family: the decision prompt as vLLM renders it, and (with an
engine) the startup check and an answer on each wire.

Used by tests/unit/test_template_matrix.py and tests/server/test_templates.py, and by
tools/checks/check_templates.py, which prints the table in docs/templates.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

from vllm.entrypoints.generate.decisions.decide.backends.logit.readouts import (
    labelled_slot,
)
from vllm.entrypoints.generate.decisions.decide.backends.logit.self_check import PROBES
from vllm.entrypoints.generate.decisions.decide.backends.logit.stencil import (
    StencilPool,
    stencil_check,
)
from vllm.entrypoints.generate.decisions.decide.engine.vllm_host import VllmHost
from vllm.entrypoints.generate.decisions.decide.prompting.answer_slot import (
    AnswerSlotPlacer,
    supported_reasoning_blocks,
)
from vllm.entrypoints.generate.decisions.decide.prompting.chat_template import (
    takes_system_role,
)
from vllm.entrypoints.generate.decisions.decide.prompting.labels import (
    MARKERS,
    LabelCatalog,
    pair_candidates,
)
from vllm.entrypoints.generate.decisions.decide.prompting.prompt import question_text
from vllm.entrypoints.generate.decisions.decide.questions import (
    CHOICE,
    SCORE,
    ChoiceQuestion,
    ScoreQuestion,
)

from .families import Family

MODELS = Path(
    os.environ.get(
        "DECISIONS_MODELS", Path.home() / ".cache" / "vllm-decisions" / "models"
    )
)


def family_path(family: Family) -> Path:
    """The family's tiny checkpoint, built by tools/env/setup.sh (one stamp for all families)."""
    if not (MODELS / "templates" / ".complete").exists():
        raise FileNotFoundError(
            f"the template-matrix checkpoints are missing from {MODELS}: run tools/env/setup.sh"
        )
    return MODELS / "templates" / family.name


def engine_args(family: Family, **more: Any) -> dict[str, Any]:
    """How every check loads the family's checkpoint (the template is the checkpoint's own)."""
    return dict(
        model=str(family_path(family)),
        tokenizer_mode=family.tokenizer_mode,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=2048,
        block_size=32,
        **more,
    )


def renderer_host(family: Family) -> VllmHost:
    """The decision host as a server builds it, over vLLM's own renderer for this checkpoint, with no engine:
    prompts render exactly as the server renders them; reads are impossible."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers.registry import renderer_from_config

    config = EngineArgs(**engine_args(family)).create_engine_config()
    # The renderer deep-copies the tokenizer into a pool for concurrent requests (seconds for a 262k
    # vocabulary); one caller here needs none of that, and rendering is the same without it.
    with mock.patch("vllm.renderers.hf.maybe_make_thread_pool"):
        renderer = renderer_from_config(config)
    client = SimpleNamespace(
        model_config=config.model_config, vllm_config=config, renderer=renderer
    )
    return VllmHost(client, family.name)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PromptChecks:
    system_role: (
        bool  # the instructions in a system message (else at the head of the user turn)
    )
    closing: str  # what the answer slot appends to close the template's open ending
    markers: int  # of the 26 letters, single tokens at the answer slot
    pairs: int  # letter pairs (AA..ZZ) that are single tokens there: the wide-direct capacity beyond 26
    stencil: bool  # the state renders once per request (token-equal to full rendering)
    reasoning_blocks: tuple[str, ...]  # the empty blocks the self-check could prefill
    prompt: str  # the rendered decision prompt of the first self-check probe, up to the answer cue
    prompt_tokens: int  # its length in tokens
    # The layout a read asking for words gets ("words", or "markers" where the words aren't single tokens)
    # for a yes/no question, a 9-level score and a choice of short values (WORD_QUESTIONS).
    word_layouts: tuple[str, ...]
    words_prompt: str  # the first probe's prompt in the words layout (a yes/no: Yes/No)
    words_prompt_tokens: int


# Questions whose words are single tokens on the real tokenizers of every family (not on a tiny local one).
WORD_QUESTIONS = (
    SCORE.compile(
        ScoreQuestion(
            instructions="How sure?", criteria=[f"level {i}" for i in range(9)]
        )
    ),
    CHOICE.compile(
        ChoiceQuestion(
            instructions="Which team?",
            criteria={"billing": None, "technical": None, "sales": None},
        )
    ),
)


async def prompt_checks(host: VllmHost) -> PromptChecks:
    system_role = await takes_system_role(host)
    prompts = StencilPool(host, enabled=False, system_role=system_role)
    placer = AnswerSlotPlacer(host)
    state, question = PROBES[0]
    labels = LabelCatalog(tuple(MARKERS), ()).labels(len(question.options))
    rendered = await prompts.prompt_ids(state, question_text(question, labels))
    slot = placer.place(rendered, labels)
    words = await labelled_slot(
        prompts, placer, LabelCatalog(tuple(MARKERS), ()), state, question, words=True
    )
    word_layouts = [words.layout]
    for other in WORD_QUESTIONS:
        word_layouts.append(
            (
                await labelled_slot(
                    prompts,
                    placer,
                    LabelCatalog(tuple(MARKERS), ()),
                    state,
                    other,
                    words=True,
                )
            ).layout
        )
    return PromptChecks(
        system_role=system_role,
        closing=placer.closing(rendered),
        markers=len(placer.single_token_labels(rendered, list(MARKERS))),
        pairs=len(placer.single_token_labels(rendered, pair_candidates(MARKERS))),
        stencil=await stencil_check(host, system_role),
        reasoning_blocks=tuple(supported_reasoning_blocks(host)),
        prompt=host.decode(slot.prompt_ids),
        prompt_tokens=len(slot.prompt_ids),
        word_layouts=tuple(word_layouts),
        words_prompt=host.decode(words.slot.prompt_ids),
        words_prompt_tokens=len(words.slot.prompt_ids),
    )


@dataclass(frozen=True)
class EngineChecks:
    startup: str  # the startup log's account of the decision prompt (logit backend.describe_prompt)
    option_mass: float  # the self-check's (noise on random weights: only its construction is checked)
    openai: Any  # status and body of a /v1/decisions answer
    jev: Any  # status and body of a /v1/systemone answer


async def engine_checks(family: Family) -> EngineChecks:
    """The family's checkpoint on an in-process vLLM engine: the decision service started as a server's is
    (the startup check with VLLM_TYPED_DECISIONS_MIN_OPTION_MASS=0, since random weights show no mass; no
    calibration), then one question on each wire. Set the variables before vLLM reads them."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.generate.decisions.bulk import Decisions
    from vllm.entrypoints.generate.decisions.decide.backends.logit.backend import (
        describe_prompt,
    )
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(**engine_args(family, enable_prefix_caching=True))
    )
    try:
        decisions = await Decisions.start(engine, served_model=family.name)
        facts = decisions.service.base.backend.facts  # type: ignore[attr-defined]
        openai = await decisions.decide(
            {
                "model": family.name,
                "input": "Refund not received after 10 days.",
                "questions": [{"type": "predicate", "instructions": "Is it urgent?"}],
            }
        )
        jev = await decisions.decide(
            {
                "state": "Card charged twice!",
                "questions": {
                    "team": {
                        "type": "choice",
                        "instructions": "Which team?",
                        "criteria": {"billing": None, "tech": None},
                    }
                },
            },
            url="/v1/systemone",
        )
        return EngineChecks(
            describe_prompt(facts),
            facts.option_mass,
            (openai.status, openai.body),
            (jev.status, jev.body),
        )
    finally:
        engine.shutdown()


ENGINE_ENV = {
    "VLLM_ENABLE_TYPED_DECISIONS": "1",
    "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
    "VLLM_TYPED_DECISIONS_BACKEND": "logit",  # the example plugin (tests/plugin) claims Qwen2 models
    "VLLM_TYPED_DECISIONS_CALIBRATION": "off",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
