# SPDX-License-Identifier: Apache-2.0
"""What one read asks of vLLM's engine, apart from the host that sends it: the engine input, the
sampling arguments of a canvas read, whether fp32 reads are available, and the engine's admission
refusals as our own error."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from vllm.entrypoints.generate.decisions.decide.errors import (
    EngineBusyError,
)
from vllm.entrypoints.generate.decisions.decide.host import TokenRead
from vllm.entrypoints.generate.decisions.decide.read_context import (
    ReadContext,
)
from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
    BUILT_IN_CANVAS_READ,
)


def engine_input(prompt_ids: list[int], context: ReadContext[Any]) -> Any:
    """The engine's input for a read: the prompt's tokens, salted with the client's ``cache_salt`` when it
    sent one (vLLM then shares prefix-cache blocks only among reads with the same salt)."""
    from vllm.inputs import tokens_input

    return tokens_input(prompt_ids, cache_salt=context.cache_salt)


def fp32_reads_missing(vllm_config: Any) -> str | None:
    """Why this engine can't recompute read log-probabilities in fp32 (None: it can)."""
    if str(vllm_config.model_config.head_dtype) == "torch.float32":
        return None  # the LM head computes fp32 logits already
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
    """``SamplingParams`` arguments for :meth:`BackendHost.read_canvas`: the canvas after the prompt starts
    as ``canvas_ids``, only its position 0 may change, the engine denoises at most ``max_steps`` times, and
    the request returns the log-probability of each of ``token_ids`` at position 0 over the whole
    vocabulary. Diffusion models take temperature 1.0 and no engine seed: both stay at their defaults.

    ``built_in`` (vLLM 0.32, vllm/utils/diffusion.py): every position but 0 is pinned to its seed, and the
    read-only request ends on its last denoise step with temperature-1 log-probabilities. ``max_tokens``
    is the canvas width, what upstream's validation gives a read-only request that names none (and, at
    width 2, what upstream's own canvas read asks for). ``diffusion_constrained`` stays off: it would
    renormalize over ``token_ids``. Otherwise (0.30): patches/00572's ``canvas_read``, with max_tokens=1."""
    if built_in:
        extra: dict[str, Any] = {
            "diffusion_seed_canvas": canvas_ids,
            "diffusion_canvas_length": len(canvas_ids),
            "diffusion_pinned": list(range(1, len(canvas_ids))),
            "diffusion_max_steps": max_steps,
            "diffusion_read_only": True,
        }
        max_tokens = len(canvas_ids)
    else:
        extra = {
            "canvas_read": {"canvas": canvas_ids, "slots": [0], "max_steps": max_steps}
        }
        max_tokens = 1
    return {
        "max_tokens": max_tokens,
        "logprob_token_ids": token_ids,
        "detokenize": False,
        "extra_args": extra,
    }


def only(read: TokenRead, token_ids: Sequence[int]) -> TokenRead:
    """``read`` without the tokens nobody asked for (the engine adds the sampled one)."""
    wanted = set(token_ids)
    return TokenRead(
        {t: v for t, v in read.logprobs.items() if t in wanted},
        read.prompt_tokens,
        read.cached_tokens,
    )


@contextmanager
def engine_admission() -> Iterator[None]:
    """Turns the engine's refusal of a request over its queue limits into :class:`EngineBusyError`."""
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    try:
        yield
    except QueueOverflowError:
        raise EngineBusyError("--max-num-queued-reqs") from None
    except MaxQueuedTokensError:
        raise EngineBusyError("--max-num-queued-tokens") from None
