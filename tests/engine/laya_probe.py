"""Run token-id prompts through LayaForDecision in an in-process vLLM engine and print, as JSON, each
prompt's pooling output and the dtypes the encoder and the decision head were loaded in.

usage: laya_probe.py CHECKPOINT DTYPE < prompts.json   (a JSON list of token-id lists)
A separate process per engine keeps vLLM's global state out of the test session.
"""

from __future__ import annotations

import json
import math
import os
import sys


def main() -> None:
    os.environ.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TORCH_COMPILE_DISABLE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    from vllm import LLM

    checkpoint, dtype = sys.argv[1], sys.argv[2]
    prompts = json.load(sys.stdin)
    llm = LLM(
        model=checkpoint, dtype=dtype, enforce_eager=True, max_model_len=1024, seed=0
    )
    outputs = llm.encode(
        [{"prompt_token_ids": ids} for ids in prompts], pooling_task="token_classify"
    )
    dtypes = llm.apply_model(
        lambda model: [
            str(model.encoder.embeddings.tok_embeddings.weight.dtype),
            str(model.decision.type_emb.weight.dtype),
        ]
    )[0]

    def plain(value: float) -> float | None:
        return None if math.isnan(value) else value  # JSON has no NaN

    print(
        json.dumps(
            {
                "outputs": [
                    [plain(float(v)) for v in o.outputs.data.flatten().tolist()]
                    for o in outputs
                ],
                "encoder_dtype": dtypes[0],
                "head_dtype": dtypes[1],
            }
        )
    )


if __name__ == "__main__":
    main()
