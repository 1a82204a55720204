"""A plain-PyTorch Laya decision model, written from docs/laya-checkpoint.md, to check servers against.

It reads a checkpoint folder of our layout with transformers' ``ModernBertModel`` and builds the head from
stock ``torch.nn`` modules, one unpadded sequence at a time and always in fp32, so it shares no code and
no batching logic with the overlay or the vLLM patch it is a yardstick for.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import ModernBertConfig, ModernBertModel


def _head_layer(d: int, laya: dict) -> nn.TransformerEncoderLayer:
    """One of the head's pre-norm layers: ReLU, LayerNorm eps 1e-5, no dropout."""
    return nn.TransformerEncoderLayer(
        d,
        laya["head_heads"],
        laya["head_ffn_size"],
        0.0,
        "relu",
        1e-5,
        batch_first=True,
        norm_first=True,
    )


class Layers(nn.Module):
    def __init__(self, layers: list[nn.TransformerEncoderLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class Head(nn.Module):
    """Laya's decision head; attribute names follow the checkpoint's weight names."""

    def __init__(self, d: int, laya: dict) -> None:
        super().__init__()
        self.type_emb = nn.Embedding(3, d)
        self.head = Layers([_head_layer(d, laya) for _ in range(laya["head_layers"])])
        self.scorer = nn.Sequential(
            nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1)
        )
        self.act_head = nn.Sequential(
            nn.Linear(d + 4, laya["act_hidden_size"]),
            nn.GELU(),
            nn.Linear(laya["act_hidden_size"], laya["act_size"]),
        )
        self.register_buffer("temperature", torch.ones(3))


class Reference:
    def __init__(self, checkpoint_dir: Path) -> None:
        document = json.loads((checkpoint_dir / "config.json").read_text())
        self.laya = document["laya_config"]
        config = ModernBertConfig.from_pretrained(checkpoint_dir)
        config._attn_implementation = "eager"
        weights = {
            k: v.float()
            for k, v in load_file(str(checkpoint_dir / "model.safetensors")).items()
        }
        self.encoder = ModernBertModel(config).float().eval()
        self.encoder.load_state_dict(_under(weights, "encoder."), strict=True)
        self.head = Head(config.hidden_size, self.laya).float().eval()
        self.head.load_state_dict(
            {k: v for k, v in weights.items() if not k.startswith("encoder.")},
            strict=True,
        )

    @torch.no_grad()
    def outputs(self, token_ids: list[int]) -> list[float]:
        laya = self.laya
        markers = [i for i, t in enumerate(token_ids) if t == laya["mask_token_id"]]
        by_token = {
            tid: laya["question_types"][name]
            for name, tid in laya["question_type_token_ids"].items()
        }
        row = by_token.get(token_ids[1]) if len(token_ids) > 1 else None
        if not markers or row is None:
            return [math.nan] * (len(markers) + laya["act_size"])
        ids = torch.tensor([token_ids])
        h = self.encoder(
            input_ids=ids, attention_mask=torch.ones_like(ids)
        ).last_hidden_state.float()
        h = h + self.head.type_emb.weight[row]
        for layer in self.head.head.layers:
            h = layer(h)
        scores = self.head.scorer(h[0, markers]).squeeze(-1)
        act = self.head.act_head(torch.cat([h[0, 0], _option_features(scores)]))
        return [float(x) for x in (*scores, *act)]


def _under(weights: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def _option_features(scores: torch.Tensor) -> torch.Tensor:
    """Top probability, its lead over the runner-up (a lone option's runner-up is 0), normalised entropy,
    and the option count over 255 (counts below 2 read as 2)."""
    p = torch.softmax(scores, dim=-1)
    ranked = torch.sort(p, descending=True).values
    second = ranked[1] if len(ranked) > 1 else torch.zeros(())
    k = max(len(p), 2)
    entropy = -(p * torch.log(p.clamp_min(1e-9))).sum() / math.log(k)
    return torch.stack(
        [ranked[0], ranked[0] - second, entropy, torch.tensor(k / 255.0)]
    )


@functools.lru_cache(maxsize=4)
def _load(checkpoint_dir: str) -> Reference:
    return Reference(Path(checkpoint_dir))


def reference_outputs(checkpoint_dir: str | Path, token_ids: list[int]) -> list[float]:
    """What the served model must return for one prompt: k option scores in marker order, then the act
    scores; NaN in every place when the prompt has no marker or no known question-type token."""
    return _load(str(Path(checkpoint_dir).resolve())).outputs(list(token_ids))
