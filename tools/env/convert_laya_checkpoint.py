"""Turn a Laya checkpoint in Laya's published layout into the one folder layout this project serves.

Published layout (what ``laya.load`` reads): ``rl_agent_config.json``, ``model.safetensors``, ``tokenizer/``
and ``encoder/config.json``. Ours (docs/laya-checkpoint.md): ``config.json`` = the encoder config plus
``architectures: ["LayaForDecision"]`` and a ``laya_config`` block, the tokenizer files beside it, and the
same ``model.safetensors`` (Laya's state-dict names are already ours).

Laya fixes some head sizes in code rather than in its config (heads = max(1, d // 64), FFN = 4 d, act
hidden 256); every size that the weights also show is checked against them, and anything that cannot be
established, or that we do not serve (the parallel option layout, a non-ModernBERT encoder), is refused.

usage: python -m tools.env.convert_laya_checkpoint SRC DST [--prompts]
    --prompts  also ship the built-in laya_prompts.py (the server runs a checkpoint's copy only under
               --trust-remote-code; without it the built-in one is used anyway)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = (
    ROOT
    / "overlay/vllm/entrypoints/generate/decisions/decide/backends/encoder/laya_prompts.py"
)
QUESTION_TYPES = {"choice": 0, "score": 1, "noul": 2}
# Laya's defaults when rl_agent_config.json leaves a key out (laya.common.build_model / build_sequence).
DEFAULTS = {
    "max_len": 512,
    "head_max_len": 192,
    "head_layers": 2,
    "temperature": [1.0, 1.0, 1.0],
}
OPTION_MAX_TOKENS, MAX_OPTIONS, ACT_HIDDEN = 48, 255, 256
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class Refused(Exception):
    """The source cannot be converted faithfully; the message says why."""


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise Refused(f"{path} is missing: not a checkpoint in Laya's published layout")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise Refused(f"{path} is not valid JSON: {exc}") from exc


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    if not path.is_file():
        raise Refused(f"{path} is missing")
    with safe_open(str(path), framework="pt") as f:
        return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118 - a safetensors handle, not a dict


def expect(
    shapes: dict[str, tuple[int, ...]], key: str, shape: tuple[int, ...]
) -> None:
    if shapes.get(key) != shape:
        raise Refused(
            f"model.safetensors: {key} is {shapes.get(key)}, the config implies {shape}"
        )


def head_shapes(d: int, laya: dict) -> dict[str, tuple[int, ...]]:
    """The decision head's weights and their shapes (docs/laya-checkpoint.md), for hidden size ``d``."""
    ffn, hidden = laya["head_ffn_size"], laya["act_hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "type_emb.weight": (3, d),
        "temperature": (3,),
    }
    for i in range(laya["head_layers"]):
        p = f"head.layers.{i}."
        shapes |= {
            p + "self_attn.in_proj_weight": (3 * d, d),
            p + "self_attn.in_proj_bias": (3 * d,),
        }
        shapes |= {
            p + "self_attn.out_proj.weight": (d, d),
            p + "self_attn.out_proj.bias": (d,),
        }
        shapes |= {p + "linear1.weight": (ffn, d), p + "linear1.bias": (ffn,)}
        shapes |= {p + "linear2.weight": (d, ffn), p + "linear2.bias": (d,)}
        shapes |= {
            p + f"{n}.{w}": (d,) for n in ("norm1", "norm2") for w in ("weight", "bias")
        }
    shapes |= {
        "scorer.0.weight": (d,),
        "scorer.0.bias": (d,),
        "scorer.1.weight": (d, d),
        "scorer.1.bias": (d,),
    }
    shapes |= {"scorer.3.weight": (1, d), "scorer.3.bias": (1,)}
    shapes |= {"act_head.0.weight": (hidden, d + 4), "act_head.0.bias": (hidden,)}
    shapes |= {
        "act_head.2.weight": (laya["act_size"], hidden),
        "act_head.2.bias": (laya["act_size"],),
    }
    return shapes


def check_weights(
    shapes: dict[str, tuple[int, ...]], encoder: dict, laya: dict
) -> None:
    """The weights must be exactly a ModernBertModel of this config plus a head of these sizes."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    with torch.device("meta"):
        model = ModernBertModel(ModernBertConfig.from_dict(encoder))
    wanted = {f"encoder.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    wanted |= head_shapes(encoder["hidden_size"], laya)
    missing, extra = (
        sorted(wanted.keys() - shapes.keys()),
        sorted(shapes.keys() - wanted.keys()),
    )
    if missing or extra:
        raise Refused(
            f"model.safetensors does not match the config: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for key, shape in wanted.items():
        expect(shapes, key, shape)


def tokenizer_facts(tokenizer_dir: Path) -> dict:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except Exception as exc:
        raise Refused(f"the tokenizer in {tokenizer_dir} does not load: {exc}") from exc
    for name in ("cls", "sep", "mask", "pad"):
        if getattr(tokenizer, f"{name}_token_id") is None:
            raise Refused(
                f"the tokenizer has no {name} token; a Laya prompt needs [CLS], [SEP], [MASK], [PAD]"
            )
    # The model tells question types apart by the token after [CLS]: the first of "<type> question: ...".
    firsts = {
        t: tokenizer.encode(f"{t} question: x", add_special_tokens=False)[0]
        for t in QUESTION_TYPES
    }
    if len(set(firsts.values())) != len(firsts):
        raise Refused(
            f"the question types do not start with distinct tokens ({firsts})"
        )
    return {"question_type_token_ids": firsts, "mask_token_id": tokenizer.mask_token_id}


def laya_config(
    agent: dict, encoder: dict, shapes: dict[str, tuple[int, ...]], tokenizer: dict
) -> dict:
    layout = agent.get("option_layout", "sequential")
    if layout != "sequential":
        raise Refused(
            f"option_layout {layout!r}: only Laya's sequential option layout is served"
        )
    if encoder.get("model_type") != "modernbert":
        raise Refused(
            f"encoder model_type {encoder.get('model_type')!r}: only ModernBERT encoders are served"
        )
    d = encoder["hidden_size"]
    temperature = agent.get("temperature", DEFAULTS["temperature"])
    if not (isinstance(temperature, list) and len(temperature) == 3):
        raise Refused(
            f"temperature must list 3 numbers (choice, score, noul), got {temperature!r}"
        )
    act_costs = agent.get("act_costs", {})
    if not isinstance(act_costs, dict):
        raise Refused(f"act_costs must be a mapping, got {act_costs!r}")
    config = {
        "max_len": agent.get("max_len", DEFAULTS["max_len"]),
        "head_max_len": agent.get("head_max_len", DEFAULTS["head_max_len"]),
        "option_max_tokens": OPTION_MAX_TOKENS,
        "max_options": MAX_OPTIONS,
        "head_layers": agent.get("head_layers", DEFAULTS["head_layers"]),
        "head_heads": max(1, d // 64),
        "head_ffn_size": 4 * d,
        "act_hidden_size": ACT_HIDDEN,
        "act_size": len(act_costs) + 1,
        "question_types": dict(QUESTION_TYPES),
        **tokenizer,
        "temperature": temperature,
        "temperature_by_options": agent.get("temperature_by_options") or {},
        "prompt_version": "laya-v1",
    }
    if config["head_layers"] < 1:
        raise Refused("head_layers 0 (no head transformer) is not served")
    check_weights(shapes, encoder, config)
    return config


def convert(src: Path, dst: Path, prompts: bool = False) -> None:
    from transformers import ModernBertConfig

    agent = read_json(src / "rl_agent_config.json")
    encoder = read_json(src / "encoder" / "config.json")
    shapes = weight_shapes(src / "model.safetensors")
    tokenizer_dir = src / "tokenizer"
    if (
        not (tokenizer_dir / "tokenizer.json").is_file()
        or not (tokenizer_dir / "tokenizer_config.json").is_file()
    ):
        raise Refused(f"{tokenizer_dir} needs tokenizer.json and tokenizer_config.json")
    laya = laya_config(agent, encoder, shapes, tokenizer_facts(tokenizer_dir))
    # Re-spelt by transformers 5, so a config saved by 4.x (global_attn_every_n_layers, global_rope_theta)
    # reaches the server as the layer_types and rope_parameters it reads.
    encoder = ModernBertConfig.from_dict(encoder).to_dict()
    if dst.exists() and any(dst.iterdir()):
        raise Refused(f"{dst} exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    document = {**encoder, "architectures": ["LayaForDecision"], "laya_config": laya}
    (dst / "config.json").write_text(
        json.dumps(document, indent=2, sort_keys=True) + "\n"
    )
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, dst / name)
    shutil.copyfile(src / "model.safetensors", dst / "model.safetensors")
    if prompts:
        shutil.copyfile(PROMPTS, dst / "laya_prompts.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "src", type=Path, help="a checkpoint in Laya's published layout"
    )
    parser.add_argument(
        "dst", type=Path, help="where to write ours (must not exist, or be empty)"
    )
    parser.add_argument(
        "--prompts", action="store_true", help="also ship the built-in laya_prompts.py"
    )
    args = parser.parse_args(argv)
    try:
        convert(args.src, args.dst, prompts=args.prompts)
    except Refused as exc:
        print(f"convert_laya_checkpoint: refused: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
