# SPDX-License-Identifier: Apache-2.0
"""Which precision the option log-probabilities have, checked once at startup.

A bf16/fp16 LM head rounds logits coarsely enough to tie close options. patches/exact-logprobs
recomputes a read's ids in fp32; the check trusts that only if it moved the values by no more than
the head's rounding (a head the patch can't mirror fails it)."""

from __future__ import annotations

from collections.abc import Sequence

from vllm.entrypoints.generate.decisions.decide.host import BackendHost
from vllm.entrypoints.generate.decisions.decide.read_context import ReadContext

# Largest |fp32 - rounded| accepted, in nats: half a bf16 step at logits up to 256, plus the normaliser.
TOLERANCE = 1.0


async def fp32_check(
    host: BackendHost, prompt_ids: list[int], label_ids: Sequence[int]
) -> str | None:
    """None when reads that ask for fp32 get it; otherwise why not."""
    if host.logit_dtype == "float32":
        return None
    if host.fp32_reads_missing is not None:
        return host.fp32_reads_missing
    ids = list(dict.fromkeys(label_ids))
    check = ReadContext.about("", "decision-precision-check")
    plain = await host.read_token_logprobs(prompt_ids, ids, check)
    exact = await host.read_token_logprobs(
        prompt_ids, ids, check.part("fp32"), fp32=True
    )
    gaps = [
        abs(exact.logprobs[t] - plain.logprobs[t])
        for t in ids
        if t in exact.logprobs and t in plain.logprobs
    ]
    if not gaps or max(gaps) == 0.0:
        return "the engine returned the LM head's own values (a head patches/exact-logprobs can't recompute)"
    if max(gaps) > TOLERANCE:
        return f"the recomputed values moved by up to {max(gaps):.3f} nats, more than the head's rounding"
    return None


def read_precision(host: BackendHost, fp32: bool) -> str:
    return "float32" if fp32 or host.logit_dtype == "float32" else host.logit_dtype


def describe(host: BackendHost, missing: str | None) -> str:
    if host.logit_dtype == "float32":
        return (
            "decision reads: option log-probabilities in float32 (the LM head's dtype)"
        )
    if missing is None:
        return (
            f"decision reads: option log-probabilities in float32, recomputed from the {host.logit_dtype} "
            "model's final hidden state (patches/exact-logprobs)"
        )
    return f"decision reads: option log-probabilities in {host.logit_dtype}, the LM head's dtype: {missing}"
