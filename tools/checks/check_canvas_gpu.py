"""Check the canvas backend's engine read where it can run: a CUDA machine with this overlay installed into
vLLM 0.30.0 by ``./install.sh --with-canvas`` (patches/00572's ``canvas_read``) or into vLLM 0.32 by
``./install.sh`` (vLLM's built-in ``diffusion_*`` read). The requests are built by the same host code the
server uses (``host.canvas_read_args``), which picks the installed version's arguments. vLLM serves
DiffusionGemma only on its Model Runner V2, which needs Triton, so this has not run on the project's CPU
machines; what runs there is in tests/unit/test_canvas_args.py and (0.32) test_canvas_read_v032.py (the
arguments and vLLM 0.32's own admission checks), tests/install/ (0.30: the patch's arguments, maths and
denoise step) and tests/unit/test_canvas_backend.py (the backend against transformers' DiffusionGemma).

What it checks, on the tiny DiffusionGemma (tools/env/build_tiny_diffusiongemma.py):
- one-step reads of a two-token canvas (a noise token, then ``<turn|>``) after three prompts: the option
  log-probabilities at the canvas's first position, from vLLM and from transformers (tests/canvas_reference.py),
  agree within ``--tolerance``;
- vLLM refuses a canvas wider than ``canvas_length`` (32) and a step cap of 0.
Exit 0 when all of it holds. Not checked: multi-step reads (after the first step the engine's own unseeded
sampling enters, and the pinned positions matter only from the second step on).

usage: python -m tools.checks.check_canvas_gpu [--model DIR] [--tolerance 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

DEFAULT_MODEL = (
    Path.home() / ".cache" / "vllm-decisions" / "models" / "tiny-diffusiongemma"
)
QUESTIONS = [
    "Is the parcel late?",
    "Is the customer angry?",
    "Does the ticket ask for a refund?",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="largest allowed log-probability gap",
    )
    args = parser.parse_args()
    import vllm
    from tests.canvas_reference import DiffusionGemmaHost
    from vllm import LLM, SamplingParams
    from vllm.entrypoints.generate.decisions.decide.engine.requests import (
        canvas_read_args,
    )
    from vllm.entrypoints.generate.decisions.decide.vllm_versions import (
        BUILT_IN_CANVAS_READ,
    )

    read = (
        "built-in diffusion_* read"
        if BUILT_IN_CANVAS_READ
        else "patches/00572 canvas_read"
    )
    print(f"vLLM {vllm.__version__}: {read}")
    reference = DiffusionGemmaHost(args.model)
    tokenizer = reference.tokenizer
    turn_close = tokenizer.convert_tokens_to_ids("<turn|>")
    labels = [
        tokenizer.encode(" " + letter, add_special_tokens=False)[-1] for letter in "AB"
    ]
    llm = LLM(
        model=str(args.model),
        enforce_eager=True,
        dtype="float32",
        max_model_len=1024,
        diffusion_config={"canvas_length": 32},
        gpu_memory_utilization=0.3,
    )
    draw, worst, failures = random.Random(0), 0.0, 0
    for question in QUESTIONS:
        chat = [{"role": "user", "content": f"{question}\nA. yes\nB. no"}]
        prompt = (
            tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=True
            )
            + "Answer:"
        )
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        canvas = [draw.randrange(reference.vocab_size), turn_close]
        params = SamplingParams(**canvas_read_args(canvas, labels, 1))
        (output,) = llm.generate([{"prompt_token_ids": prompt_ids}], params)
        got = {
            t: v.logprob
            for t, v in output.outputs[0].logprobs[0].items()
            if t in labels
        }
        want = asyncio.run(
            reference.read_canvas(prompt_ids, canvas, labels, 1, "check")
        ).logprobs
        gap = (
            max(abs(got[t] - want[t]) for t in labels)
            if set(got) == set(labels)
            else float("inf")
        )
        worst = max(worst, gap)
        tokens = list(output.outputs[0].token_ids)
        print(
            f"{question!r}: vLLM {got} transformers {want} gap {gap:.4f}; output tokens {tokens}"
        )
    for canvas, max_steps, why in [
        ([1] * 33, 1, "wider than canvas_length"),
        ([1], 0, "max_steps 0"),
    ]:
        try:
            bad = SamplingParams(**canvas_read_args(canvas, labels, max_steps))
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], bad)
        except (
            Exception
        ) as exc:  # 0.30 raises ValueError, 0.32 VLLMValidationError (not a ValueError)
            print(f"refused ({why}): {type(exc).__name__}: {exc}")
        else:
            print(f"NOT refused: {why}")
            failures += 1
    print(
        f"largest gap {worst:.4f} (tolerance {args.tolerance}); {failures} failed checks"
    )
    return 0 if worst <= args.tolerance and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
