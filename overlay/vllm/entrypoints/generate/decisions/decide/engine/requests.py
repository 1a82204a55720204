# SPDX-License-Identifier: Apache-2.0
"""What one read asks of vLLM's engine, apart from the host that sends it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from vllm.entrypoints.generate.decisions.decide.errors import EngineBusyError
from vllm.entrypoints.generate.decisions.decide.host import TokenRead
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)


def engine_input(prompt_ids: list[int], context: ReadContext[Any]) -> Any:
    """The prompt's tokens, salted with the client's ``cache_salt`` (vLLM then shares prefix-cache
    blocks only among reads with the same salt)."""
    from vllm.inputs import tokens_input

    return tokens_input(prompt_ids, cache_salt=context.cache_salt)


def fp32_reads_missing(vllm_config: Any) -> str | None:
    """Why this engine can't recompute read log-probabilities in fp32 (None: it can)."""
    if str(vllm_config.model_config.head_dtype) == "torch.float32":
        return None
    if importlib.util.find_spec("vllm.v1.sample.exact_logprobs") is None:
        return (
            "this vLLM lacks patches/exact-logprobs-v0.30.patch (install.sh applies it)"
        )
    from vllm.v1.sample.exact_logprobs import unsupported_reason

    return unsupported_reason(vllm_config)


def canvas_read_args(
    canvas_ids: list[int],
    token_ids: list[int],
    max_steps: int,
    built_in: bool = BUILT_IN_CANVAS_READ,
) -> dict[str, Any]:
    """``SamplingParams`` arguments for :meth:`BackendHost.read_canvas`: only the canvas's position 0
    may change, and the read returns each of ``token_ids``' full-vocabulary log-probability there.
    Temperature (1.0) and seed stay at diffusion's defaults. Built in (vLLM 0.32): ``max_tokens`` is
    the canvas width, as upstream's own read-only requests ask; ``diffusion_constrained`` stays off
    (it would renormalize over ``token_ids``). Else patches/00572's ``canvas_read``, max_tokens=1."""
    read: dict[str, Any] = {"logprob_token_ids": token_ids, "detokenize": False}
    if not built_in:
        canvas = {"canvas": canvas_ids, "slots": [0], "max_steps": max_steps}
        return {**read, "max_tokens": 1, "extra_args": {"canvas_read": canvas}}
    return {
        **read,
        "max_tokens": len(canvas_ids),
        "extra_args": {
            "diffusion_seed_canvas": canvas_ids,
            "diffusion_canvas_length": len(canvas_ids),
            "diffusion_pinned": list(range(1, len(canvas_ids))),
            "diffusion_max_steps": max_steps,
            "diffusion_read_only": True,
        },
    }


def only(read: TokenRead, token_ids: Sequence[int]) -> TokenRead:
    """``read`` without the tokens nobody asked for (the engine adds the sampled one)."""
    keep = set(token_ids)
    return replace(read, logprobs={t: v for t, v in read.logprobs.items() if t in keep})


@contextmanager
def engine_admission() -> Iterator[None]:
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    try:
        yield
    except QueueOverflowError:
        raise EngineBusyError("--max-num-queued-reqs") from None
    except MaxQueuedTokensError:
        raise EngineBusyError("--max-num-queued-tokens") from None
