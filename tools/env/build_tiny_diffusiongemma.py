"""Build a tiny random-weight DiffusionGemma (DiffusionGemmaForBlockDiffusion) for the canvas backend's
tests, offline and in seconds: hidden size 64, 2 layers (one sliding, one full), 4 experts, a tiny vision
tower. Its tokenizer is tiny-llama-localtok's (built first by build_tiny_models.py) plus Gemma 4's turn
markers ``<|turn>`` / ``<turn|>`` and a Gemma-4-style chat template. Its answers are noise.

usage: build_tiny_diffusiongemma.py MODELS_DIR   (reads MODELS_DIR/tiny-llama-localtok)
"""

from __future__ import annotations

import json
import os
import shutil
import sys

TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{{- message['content'] + '<turn|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|turn>model\\n' }}{%- endif %}"
)
# What vLLM's DiffusionGemma model state requires of generation_config.json (transformers' defaults).
GENERATION = {
    "max_denoising_steps": 48,
    "sampler_config": {"entropy_bound": 0.1, "_cls_name": "EntropyBoundSamplerConfig"},
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}


def build(models: str) -> str:
    import torch
    from transformers import (
        AutoTokenizer,
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
    )

    out = os.path.join(models, "tiny-diffusiongemma")
    shutil.rmtree(out, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.join(models, "tiny-llama-localtok")
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn>", "<turn|>"]})
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(out)
    vocab = (len(tokenizer) + 63) // 64 * 64
    turn_close = tokenizer.convert_tokens_to_ids("<turn|>")
    text = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        # save_pretrained drops the full-attention overrides: keep them equal to the defaults above.
        global_head_dim=32,
        num_global_key_value_heads=1,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=512,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=64,
        max_position_embeddings=1024,
        final_logit_softcapping=30.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=turn_close,
        bos_token_id=None,
    )
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        pooling_kernel_size=2,
        position_embedding_size=64,
    )
    config = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=32,
        image_token_id=vocab - 1,
        boi_token_id=vocab - 2,
        eoi_token_id=vocab - 3,
    )
    config.architectures = ["DiffusionGemmaForBlockDiffusion"]
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(
            {
                **GENERATION,
                "eos_token_id": turn_close,
                "pad_token_id": tokenizer.pad_token_id,
            },
            f,
            indent=2,
        )
    print(
        f"saved {out}: DiffusionGemmaForBlockDiffusion, vocabulary {len(tokenizer)} (model {vocab})"
    )
    return out


if __name__ == "__main__":
    build(sys.argv[1])
