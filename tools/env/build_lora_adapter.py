"""A small PEFT LoRA adapter over a local model's ``q_proj`` and ``v_proj``, with random weights large
enough that its answers measurably differ from the base model's: for tests/server/test_lora.py and
``python -m tools.bench.bench --adapter``. Milliseconds for the tiny models (no peft needed: the two files PEFT
writes, written here with torch and safetensors).

usage: python -m tools.env.build_lora_adapter MODEL_DIR OUT_DIR [--seed N] [--rank R]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TARGETS = ("q_proj", "v_proj")


def build(model_dir: Path, out: Path, seed: int = 0, rank: int = 8) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` for ``model_dir`` into ``out``.
    B is not zero (a trained adapter's isn't), and each delta is large against the base weights (on
    tiny-qwen2-random, entries of std 0.19 beside the base's 0.02), so the adapter's option logits differ
    clearly from the base model's."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    outputs = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "v_proj": config.get("num_key_value_heads", config["num_attention_heads"])
        * head_dim,
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            name = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{name}.lora_A.weight"] = (
                torch.randn(rank, hidden, generator=generator) / hidden**0.5
            )
            tensors[f"{name}.lora_B.weight"] = (
                torch.randn(outputs[target], rank, generator=generator) * 0.5
            )
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(
        json.dumps(adapter_config, indent=2) + "\n"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    print(build(args.model_dir, args.out_dir, args.seed, args.rank))


if __name__ == "__main__":
    main()
