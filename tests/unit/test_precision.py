"""The startup check of fp32 reads (backends/logit/precision.py) against a scripted host: the
recomputation is trusted only when it moves values off the head's grid by less than its rounding."""

from __future__ import annotations

import pytest

from vllm.entrypoints.generate.decisions.decide.backends.logit.precision import (
    describe,
    fp32_check,
    read_precision,
)
from vllm.entrypoints.generate.decisions.decide.host import TokenRead

from .fakes import TokenizerHost


class PrecisionHost(TokenizerHost):
    """Reads return ``plain`` values, or ``plain + shift`` when fp32 is asked for."""

    def __init__(
        self, tokenizer, dtype: str, missing: str | None, shift: float
    ) -> None:
        super().__init__(tokenizer)
        self.logit_dtype, self.fp32_reads_missing, self.shift = dtype, missing, shift

    async def read_token_logprobs(self, prompt_ids, token_ids, request_id, fp32=False):
        return TokenRead(
            {t: -1.0 - t % 5 + (self.shift if fp32 else 0.0) for t in token_ids},
            len(prompt_ids),
            0,
        )


@pytest.mark.parametrize(
    ("dtype", "missing", "shift", "verdict"),
    [
        ("float32", "no patch", 0.0, None),  # the head computes fp32 already
        ("bfloat16", None, 0.03, None),  # recomputed, within the head's rounding
        (
            "bfloat16",
            "this vLLM lacks patches/exact-logprobs",
            0.03,
            "lacks patches/exact-logprobs",
        ),
        (
            "bfloat16",
            None,
            0.0,
            "the LM head's own values",
        ),  # the patch left the values alone
        (
            "bfloat16",
            None,
            4.0,
            "more than the head's rounding",
        ),  # a head the patch can't mirror
    ],
)
async def test_fp32_check(smollm2_tokenizer, dtype, missing, shift, verdict):
    host = PrecisionHost(smollm2_tokenizer, dtype, missing, shift)
    found = await fp32_check(host, [1, 2, 3], [30, 31, 30])
    assert found is None if verdict is None else verdict in found
    assert read_precision(host, found is None) == (
        "float32" if found is None else dtype
    )
    assert ("in float32" in describe(host, found)) == (found is None)
