"""Read next-token log-probabilities of chosen ids in an in-process vLLM engine and print them as JSON:
for each prompt, an exact read (``logprob_token_ids``) and a top-k read, each with and without
``extra_args={"fp32_logprobs": True}`` (patches/exact-logprobs), and an exact read of one batch in
which every other request asks for fp32.

usage: logprob_probe.py CHECKPOINT DTYPE HEAD_DTYPE WINDOW < {"prompts": [[ids...]], "labels": [ids...]}
HEAD_DTYPE is "model" or "float32" (vLLM's own --hf-overrides head_dtype). A separate process per
engine keeps vLLM's global state out of the test session.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    os.environ.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TORCH_COMPILE_DISABLE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    from vllm import LLM, SamplingParams

    checkpoint, dtype, head_dtype, window = (
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
    )
    job = json.load(sys.stdin)
    # No prefix cache: each batch below prefills afresh, so the reads compared differ only in what they ask
    # for (with native bf16 kernels, AMX say, a read over cached blocks differs from a fresh one by hundredths).
    llm = LLM(
        model=checkpoint,
        dtype=dtype,
        enforce_eager=True,
        max_model_len=2048,
        seed=0,
        max_logprobs=window,
        block_size=32,
        hf_overrides={"head_dtype": head_dtype},
        enable_prefix_caching=False,
    )
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]

    def params(fp32: bool, exact: bool) -> SamplingParams:
        extra = {"fp32_logprobs": True} if fp32 else None
        if exact:
            return SamplingParams(
                max_tokens=1,
                temperature=0.0,
                logprob_token_ids=job["labels"],
                extra_args=extra,
            )
        return SamplingParams(
            max_tokens=1, temperature=0.0, logprobs=window, extra_args=extra
        )

    def read(fp32: list[bool], exact: bool) -> list[dict[str, float]]:
        outputs = llm.generate(
            prompts, [params(f, exact) for f in fp32], use_tqdm=False
        )
        return [
            {str(t): p.logprob for t, p in o.outputs[0].logprobs[0].items()}
            for o in outputs
        ]

    every, none = [True] * len(prompts), [False] * len(prompts)
    alternate = [i % 2 == 0 for i in range(len(prompts))]
    print(
        json.dumps(
            {
                "exact": read(none, True),
                "exact_fp32": read(every, True),
                "exact_mixed": read(alternate, True),
                "top_k": read(none, False),
                "top_k_fp32": read(every, False),
            }
        )
    )


if __name__ == "__main__":
    main()
