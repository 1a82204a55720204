"""Check patches/00572 where it can run: a CUDA machine with vLLM 0.30.0 and this overlay installed by
``./install.sh --with-canvas``. vLLM serves DiffusionGemma only on its Model Runner V2, which needs
Triton, so this has not run on the project's CPU machines; what runs there is in tests/install/
(the patch's arguments, maths and denoise step) and tests/unit/test_canvas_backend.py (the backend
against transformers' DiffusionGemma).

It reads one-step canvases of the tiny DiffusionGemma (tools/env/build_tiny_diffusiongemma.py) through
vLLM and through transformers (tests/canvas_reference.py) and compares the option log-probabilities;
then it checks that vLLM refuses malformed canvas reads. Exit 0 when everything agrees.

usage: python tools/check_canvas_gpu.py [--model DIR] [--tolerance 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache" / "vllm-decisions" / "models" / "tiny-diffusiongemma"
QUESTIONS = ["Is the parcel late?", "Is the customer angry?", "Does the ticket ask for a refund?"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tolerance", type=float, default=0.05, help="largest allowed log-probability gap")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.canvas_reference import DiffusionGemmaHost
    from vllm import LLM, SamplingParams

    reference = DiffusionGemmaHost(args.model)
    tokenizer = reference.tokenizer
    turn_close = tokenizer.convert_tokens_to_ids("<turn|>")
    labels = [tokenizer.encode(" " + letter, add_special_tokens=False)[-1] for letter in "AB"]
    llm = LLM(model=str(args.model), enforce_eager=True, dtype="float32", max_model_len=1024,
              diffusion_config={"canvas_length": 32}, gpu_memory_utilization=0.3)  # fmt: skip
    draw, worst, failures = random.Random(0), 0.0, 0
    for question in QUESTIONS:
        chat = [{"role": "user", "content": f"{question}\nA. yes\nB. no"}]
        prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) + "Answer:"
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        canvas = [draw.randrange(reference.vocab_size), turn_close]
        params = SamplingParams(max_tokens=1, logprob_token_ids=labels,
                                extra_args={"canvas_read": {"canvas": canvas, "slots": [0], "max_steps": 1}})  # fmt: skip
        (output,) = llm.generate([{"prompt_token_ids": prompt_ids}], params)
        got = {t: v.logprob for t, v in output.outputs[0].logprobs[0].items() if t in labels}
        want = asyncio.run(reference.read_canvas(prompt_ids, canvas, labels, 1, "check")).logprobs
        gap = max(abs(got[t] - want[t]) for t in labels) if set(got) == set(labels) else float("inf")
        worst = max(worst, gap)
        print(f"{question!r}: vLLM {got} transformers {want} gap {gap:.4f}")
    for bad, why in [
        ({"canvas": [1] * 33}, "wider than canvas_length"),
        ({"canvas": [1], "max_steps": 0}, "max_steps 0"),
    ]:
        try:
            llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                         SamplingParams(max_tokens=1, logprob_token_ids=labels, extra_args={"canvas_read": bad}))  # fmt: skip
        except ValueError as exc:
            print(f"refused ({why}): {exc}")
        else:
            print(f"NOT refused: {why}")
            failures += 1
    print(f"largest gap {worst:.4f} (tolerance {args.tolerance}); {failures} refusals missing")
    return 0 if worst <= args.tolerance and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
