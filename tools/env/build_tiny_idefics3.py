"""Build a tiny random-weight Idefics3 (SigLIP-style vision tower, pixel-shuffle connector, Llama text
model) that vLLM 0.30's CPU build serves without torchvision, offline and deterministically: the
vision-language model decisions about images (issue 52) are to be tested on. Not built by setup.sh yet.

Why Idefics3: in this venv (torchvision uninstalled) vLLM's llava / llava_next / mistral3 / pixtral,
qwen2_vl / qwen2_5_vl / qwen3_vl, gemma3_mm and lfm2_vl modules fail at import time (they import a
torchvision-only transformers image processor module); idefics3, smolvlm and paligemma import fine,
and Idefics3's processor has no video processor (SmolVLM's has, and that needs torchvision).

The tokenizer is a local checkpoint's ``tokenizer.json`` (SmolLM2's by default: a third of Qwen's, and
a second faster to load) plus Idefics3's 40 special tokens; the image processor is
``Idefics3ImageProcessorPil``, with image splitting on: without it transformers counts 0 patches for
an image and vLLM's startup profiling fails (``cannot reshape tensor of 0 elements``).

Measured on a 2-core Xeon (2026-12-06), Qwen vocabulary: built in 9 s (51 MB); ``vllm serve
--max-model-len 512 --enforce-eager --dtype float32`` up in 48 s, 4.3 GB in all; two images give
different next-token log-probabilities, the same image twice identical ones, offline and served alike.

Shapes:
  vision: image 32x32, patch 8 -> 16 patches; hidden 64, 2 layers, 2 heads (head 32)
  connector: pixel shuffle x2 -> 4 tokens per tile, linear 256 -> 64
  text: Llama, hidden 64, 2 layers, 2 heads / 1 KV head (head 32), vocab 152000, tied embeddings
  images are resized to longest edge 64, cut into up to 2x2 tiles of 32 + 1 global view
  (up to 5 x 4 = 20 <image> tokens)

usage: python -m tools.env.build_tiny_idefics3 OUT_DIR [TOKENIZER_DIR] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from tools.env.build_tiny_models import CHATML, tiny_size

TILE, PATCH, SCALE = 32, 8, 2
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE**2  # 4
SPECIALS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument(
        "tokenizer_dir",
        nargs="?",
        default=os.path.expanduser(
            "~/.cache/vllm-decisions/models/smollm2-135m-instruct"
        ),
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    t0 = time.time()

    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    os.makedirs(args.out_dir, exist_ok=True)

    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    tok.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in SPECIALS]
    )
    eos_tok = "<|im_end|>" if tok.token_to_id("<|im_end|>") is not None else "</s>"
    pad_tok = (
        "<|endoftext|>" if tok.token_to_id("<|endoftext|>") is not None else eos_tok
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos_tok, pad_token=pad_tok, bos_token=None
    )
    for t in SPECIALS:
        assert len(fast.encode(t, add_special_tokens=False)) == 1, t
    image_id = fast.convert_tokens_to_ids("<image>")
    eos, pad = fast.convert_tokens_to_ids(eos_tok), fast.convert_tokens_to_ids(pad_tok)

    image_processor = Idefics3ImageProcessorPil(
        do_convert_rgb=True,
        do_resize=True,
        size={"longest_edge": 2 * TILE},
        max_image_size={"longest_edge": TILE},
        do_image_splitting=True,
        do_rescale=True,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_pad=True,
    )
    fast.chat_template = CHATML
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=fast,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHATML,
    )
    processor.save_pretrained(args.out_dir)
    # Older transformers (and some tools) look for a standalone preprocessor_config.json.
    image_processor.save_pretrained(args.out_dir)

    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
    )
    text = LlamaConfig(**tiny_size(len(fast), eos, pad, None))
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=image_id,
        scale_factor=SCALE,
        tie_word_embeddings=True,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    config.eos_token_id, config.pad_token_id = eos, pad

    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config)
    # N(0, 0.02) init gives nearly flat logprobs; widen the matrices so top tokens are distinct.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model = model.to(getattr(torch, args.dtype))
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    model.save_pretrained(args.out_dir, safe_serialization=True)

    size = sum(
        os.path.getsize(os.path.join(args.out_dir, f)) for f in os.listdir(args.out_dir)
    )
    print(
        json.dumps(
            {
                "out_dir": args.out_dir,
                "params": sum(p.numel() for p in model.parameters()),
                "image_token_id": image_id,
                "image_seq_len": IMAGE_SEQ_LEN,
                "vocab_size": text.vocab_size,
                "files": sorted(os.listdir(args.out_dir)),
                "bytes": size,
                "build_s": round(time.time() - t0, 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
