# SPDX-License-Identifier: Apache-2.0
"""What the encoder backend reads from a Laya checkpoint: its ``laya_config`` and its prompt builder."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm.entrypoints.generate.decisions.decide.backends.encoder import laya_prompts
from vllm.entrypoints.generate.decisions.decide.errors import BackendUnavailable
from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.validation import validation_message
from vllm.logger import init_logger

logger = init_logger(__name__)

LAYA_TYPES = ("choice", "score", "noul")
# Laya's own agent confines its fitted temperatures to this range before applying them.
TEMPERATURE_RANGE = (0.5, 5.0)
# The option-count buckets of ``temperature_by_options`` ("choice:3-5"), each up to its most; then "11+".
OPTION_BUCKETS = (("2", 2), ("3-5", 5), ("6-10", 10))


class LayaConfig(BaseModel):
    """The ``laya_config`` block of a checkpoint's config.json (docs/laya-checkpoint.md)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    max_len: int = Field(gt=0)
    head_max_len: int = Field(gt=0)
    option_max_tokens: int = Field(default=48, gt=0)
    max_options: int = Field(default=255, gt=0)
    act_size: int = Field(gt=0)
    question_types: dict[str, int]
    question_type_token_ids: dict[str, int]
    mask_token_id: int
    temperature: list[float] = Field(
        default=[1.0, 1.0, 1.0], min_length=3, max_length=3
    )
    temperature_by_options: dict[str, float] = {}
    prompt_version: str = laya_prompts.PROMPT_VERSION

    def checkpoint_temperature(self, question_type: str, options: int) -> float:
        """The temperature Laya's own agent would apply to this question (reported, not applied)."""
        size = next((name for name, most in OPTION_BUCKETS if options <= most), "11+")
        row = self.question_types.get(question_type, 0)
        value = self.temperature_by_options.get(
            f"{question_type}:{size}", self.temperature[row]
        )
        low, high = TEMPERATURE_RANGE
        return min(high, max(low, value))


def read_laya_config(host: BackendHost) -> LayaConfig:
    block = host.checkpoint_config().get("laya_config")
    if not isinstance(block, dict):
        raise BackendUnavailable(
            "the served checkpoint's config.json has no laya_config block; is it a Laya checkpoint?"
        )
    try:
        config = LayaConfig.model_validate(block)
    except ValidationError as exc:
        raise BackendUnavailable(
            validation_message(exc, "config.json laya_config")
        ) from None
    known = config.question_types.keys() & config.question_type_token_ids.keys()
    if missing := [t for t in LAYA_TYPES if t not in known]:
        raise BackendUnavailable(
            f"laya_config names no question type row or token for {', '.join(missing)}"
        )
    return config


@dataclass(frozen=True)
class PromptBuilder:
    build: Callable[..., tuple[list[int], list[int]]]
    source: str  # "checkpoint" (its laya_prompts.py) or "built-in"


def load_prompt_builder(host: BackendHost) -> PromptBuilder:
    """The checkpoint's own ``laya_prompts.py`` when vLLM may run its code, else the built-in one."""
    built_in = PromptBuilder(laya_prompts.build_prompt, "built-in")
    source = host.checkpoint_file("laya_prompts.py")
    if source is None:
        return built_in
    if not host.trust_remote_code:
        logger.warning(
            "the checkpoint ships laya_prompts.py, which runs only with --trust-remote-code; "
            "using the built-in Laya prompt builder"
        )
        return built_in
    module = types.ModuleType("laya_prompts_from_checkpoint")
    exec(compile(source, "laya_prompts.py (checkpoint)", "exec"), module.__dict__)  # noqa: S102 - trusted by flag
    build: Any = getattr(module, "build_prompt", None)
    if not callable(build):
        raise BackendUnavailable(
            "the checkpoint's laya_prompts.py defines no build_prompt function"
        )
    return PromptBuilder(build, "checkpoint")
