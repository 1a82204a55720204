"""Build ``tiny-laya``: a random-weight Laya decision model in the layout of docs/laya-checkpoint.md.

A ModernBERT encoder (hidden size 64, one full-attention and one sliding-attention layer with a 16-token
window, so prompts longer than the window exercise both mask kinds) under Laya's decision head, with a
small WordPiece tokenizer laid out here. Weights are drawn from a fixed seed at scales large enough that
option scores differ visibly; the answers are noise. Offline, deterministic, a few seconds.

usage: build_tiny_laya.py OUT_DIR        (writes OUT_DIR/tiny-laya, ``.complete`` last)
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = (
    ROOT
    / "overlay/vllm/entrypoints/generate/decisions/decide/backends/encoder/laya_prompts.py"
)
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4, in this order
QUESTION_TYPES = {"choice": 0, "score": 1, "noul": 2}
HIDDEN, HEAD_LAYERS, HEAD_HEADS, HEAD_FFN, ACT_HIDDEN, ACT_SIZE = 64, 2, 1, 256, 256, 3
LAYA_CONFIG = {
    "max_len": 512,
    "head_max_len": 192,
    "option_max_tokens": 48,
    "max_options": 255,
    "head_layers": HEAD_LAYERS,
    "head_heads": HEAD_HEADS,
    "head_ffn_size": HEAD_FFN,
    "act_hidden_size": ACT_HIDDEN,
    "act_size": ACT_SIZE,
    "question_types": QUESTION_TYPES,
    "temperature": [1.3, 0.9, 1.1],
    "temperature_by_options": {"noul:2": 1.2, "choice:3-5": 0.8},
    "prompt_version": "laya-v1",
}
# Common English words plus the vocabulary of Laya prompts; each becomes one token.
WORD_TEXT = """
the be to of and a in that have i it for not on with he as you do at this but his by from they we say
her she or an will my one all would there their what so up out if about who get which go me when make
can like time no just him know take people into year your good some could them see other than then now
look only come its over think also back after use two how our work first well way even new want because
any these give day most us is are was were been has had did does said made yes true false none maybe
choice score noul question option options answer level label state input text message email customer
order refund cancel ship shipping delivery late early price cost pay paid invoice account login password
reset help support urgent spam billing bug feature request report problem issue error crash slow fast
happy angry sad neutral positive negative mixed low medium high critical minor major severe ok okay fine
statement holds hold does agree disagree correct wrong right left red green blue black white
small large big tiny short long old young hot cold open closed start stop begin end next last before
after again still never always often sometimes today tomorrow yesterday week month morning evening night
name user assistant system document page file data number value list item table row column field key
please thanks thank hello hi dear regards sorry wait need needs wants asked asks tell told ask reply
sent send received receive arrived arrive broken damaged missing wrong item product box package store
"""
WORDS = WORD_TEXT.split()
PUNCTUATION = list(".,:;!?'\"()[]{}-_/\\@#$%&*+=<>|~`^")
SUFFIXES = ["##s", "##es", "##ed", "##ing", "##ly", "##er", "##est", "##ion"]


def word_piece_tokenizer():
    """A lower-casing WordPiece tokenizer in which every listed word is one token.

    The vocabulary is laid out here rather than learnt by ``WordPieceTrainer``: the trainer breaks ties
    between equally frequent pairs in hash order, so two runs gave two different vocabularies.
    """
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    alphabet = (
        [chr(c) for c in range(ord("a"), ord("z") + 1)]
        + [str(d) for d in range(10)]
        + PUNCTUATION
    )
    pieces = (
        SPECIALS
        + alphabet
        + ["##" + c for c in alphabet]
        + SUFFIXES
        + list(dict.fromkeys(WORDS))
    )
    tokenizer = Tokenizer(
        models.WordPiece(
            {p: i for i, p in enumerate(dict.fromkeys(pieces))}, unk_token="[UNK]"
        )
    )
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    cls, sep = SPECIALS.index("[CLS]"), SPECIALS.index("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    # matched before normalisation: "[MASK]" is never split
    tokenizer.add_special_tokens(SPECIALS)
    for word in QUESTION_TYPES:  # the type token after [CLS] must be the whole word
        assert (
            tokenizer.encode(f"{word} question: x", add_special_tokens=False).tokens[0]
            == word
        ), word
    return tokenizer


def save_tokenizer(out: Path):
    from transformers import PreTrainedTokenizerFast

    specials = dict(
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=word_piece_tokenizer(), model_max_length=512, **specials
    )
    fast.save_pretrained(out)
    # transformers 5 writes its own backend's class name, which transformers 4 cannot load, and no
    # special_tokens_map.json; write the portable spelling and the map.
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(specials, indent=2, sort_keys=True) + "\n"
    )
    return fast


def encoder_config(tokenizer):
    from transformers import ModernBertConfig

    return ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        layer_types=["full_attention", "sliding_attention"],
        local_attention=16,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )


def head_shapes() -> dict[str, tuple[int, ...]]:
    """The decision head's weights as the schema names them."""
    d = HIDDEN
    shapes: dict[str, tuple[int, ...]] = {"type_emb.weight": (3, d)}
    for i in range(HEAD_LAYERS):
        p = f"head.layers.{i}."
        shapes |= {
            p + "self_attn.in_proj_weight": (3 * d, d),
            p + "self_attn.in_proj_bias": (3 * d,),
            p + "self_attn.out_proj.weight": (d, d),
            p + "self_attn.out_proj.bias": (d,),
            p + "linear1.weight": (HEAD_FFN, d),
            p + "linear1.bias": (HEAD_FFN,),
            p + "linear2.weight": (d, HEAD_FFN),
            p + "linear2.bias": (d,),
        }
        for norm in ("norm1", "norm2"):
            shapes |= {p + norm + ".weight": (d,), p + norm + ".bias": (d,)}
    shapes |= {
        "scorer.0.weight": (d,),
        "scorer.0.bias": (d,),
        "scorer.1.weight": (d, d),
        "scorer.1.bias": (d,),
        "scorer.3.weight": (1, d),
        "scorer.3.bias": (1,),
        "act_head.0.weight": (ACT_HIDDEN, d + 4),
        "act_head.0.bias": (ACT_HIDDEN,),
        "act_head.2.weight": (ACT_SIZE, ACT_HIDDEN),
        "act_head.2.bias": (ACT_SIZE,),
    }
    return shapes


def draw(name: str, shape: tuple[int, ...], generator):
    """One weight: LayerNorms near identity, matrices at 1/sqrt(fan_in) (the scorer's wider), biases small.

    transformers' own init (std 0.02) would leave attention nearly uniform and every [MASK] with almost the
    same hidden state, so all options would score alike and a test could not tell them apart.
    """
    import torch

    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    if "norm" in name or name.startswith("scorer.0."):
        return 1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise
    if len(shape) == 1:
        return 0.1 * noise
    if name.startswith("scorer.") or name == "type_emb.weight":
        return 0.5 * noise
    if name.endswith("tok_embeddings.weight"):
        return noise
    return noise / math.sqrt(shape[-1])


def build(out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import ModernBertModel

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tokenizer = save_tokenizer(out)
    config = encoder_config(tokenizer)
    with torch.device("meta"):
        encoder_shapes = {
            f"encoder.{k}": tuple(v.shape)
            for k, v in ModernBertModel(config).state_dict().items()
        }
    generator = torch.Generator().manual_seed(20250)
    weights = {
        name: draw(name, shape, generator)
        for name, shape in sorted({**encoder_shapes, **head_shapes()}.items())
    }
    weights["temperature"] = torch.tensor(
        LAYA_CONFIG["temperature"], dtype=torch.float32
    )
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})

    token_ids = {
        t: tokenizer.encode(f"{t} question: x", add_special_tokens=False)[0]
        for t in QUESTION_TYPES
    }
    laya = {
        **LAYA_CONFIG,
        "question_type_token_ids": token_ids,
        "mask_token_id": tokenizer.mask_token_id,
    }
    document = {
        **config.to_dict(),
        "architectures": ["LayaForDecision"],
        "dtype": "float32",
    }
    document |= {"torch_dtype": "float32", "laya_config": laya}
    (out / "config.json").write_text(
        json.dumps(document, indent=2, sort_keys=True) + "\n"
    )
    shutil.copyfile(PROMPTS, out / "laya_prompts.py")
    (out / ".complete").touch()
    print(
        f"saved {out}: LayaForDecision, vocabulary {len(tokenizer)}, {len(weights)} tensors"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build(Path(sys.argv[1]) / "tiny-laya")
