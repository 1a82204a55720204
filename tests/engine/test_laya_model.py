"""LayaForDecision in a real vLLM engine (CPU) against the plain-PyTorch reference on the tiny checkpoint:
one batch mixing option counts, one option, a state past the sliding window, no marker, an unknown type,
and a bf16 encoder under an fp32 head."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm.entrypoints.generate.decisions.decide.backends.encoder import laya_prompts

from ..conftest import model_path
from ..laya_reference import reference_outputs

PROBE = Path(__file__).with_name("laya_probe.py")
ACT_SIZE = 3


def build(tokenizer, state: str, qtype: str, options: list[str]) -> list[int]:
    ids, _ = laya_prompts.build_prompt(
        tokenizer,
        state,
        qtype,
        "Is this about money?",
        options,
        max_len=512,
        head_max_len=192,
        option_max_tokens=48,
    )
    return ids


@pytest.fixture(scope="module")
def prompts() -> dict[str, list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path("tiny-laya"))
    noul = build(
        tokenizer, "the bill was paid twice", "noul", ["false: no", "true: yes"]
    )
    unknown_type = list(noul)
    unknown_type[1] = tokenizer.encode("the", add_special_tokens=False)[0]
    head = tokenizer.encode("noul question: x", add_special_tokens=False)
    return {
        "noul": noul,
        "choice": build(
            tokenizer,
            "send it back",
            "choice",
            ["a: one", "b: two", "c", "d: four", "e"],
        ),
        "one option": build(tokenizer, "the bill", "choice", ["only: the one"]),
        "past the window": build(
            tokenizer,
            " ".join(["the bill was paid twice and then"] * 8),
            "score",
            ["level 0: low", "level 1: mid", "level 2: high"],
        ),
        "no marker": [
            tokenizer.cls_token_id,
            *head,
            tokenizer.sep_token_id,
            *head,
            tokenizer.sep_token_id,
        ],
        "unknown type": unknown_type,
    }


def probe(prompts: dict[str, list[int]], dtype: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(PROBE), str(model_path("tiny-laya")), dtype],
        input=json.dumps(list(prompts.values())),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    answer["outputs"] = dict(zip(prompts, answer["outputs"], strict=True))
    return answer


@pytest.fixture(scope="module")
def fp32(prompts):
    return probe(prompts, "float32")


@pytest.fixture(scope="module")
def bf16(prompts):
    return probe(prompts, "bfloat16")


@pytest.mark.parametrize("name", ["noul", "choice", "one option", "past the window"])
def test_fp32_matches_the_reference(fp32, prompts, name):
    expected = reference_outputs(model_path("tiny-laya"), prompts[name])
    got = fp32["outputs"][name]
    options = len(expected) - ACT_SIZE
    assert len(got) == len(expected) and options == prompts[name].count(_mask())
    assert got == pytest.approx(expected, abs=1e-4)
    assert fp32["encoder_dtype"] == fp32["head_dtype"] == "torch.float32"


def _mask() -> int:
    config = json.loads((model_path("tiny-laya") / "config.json").read_text())
    return int(config["laya_config"]["mask_token_id"])


def test_nothing_to_decide_is_nan_not_a_score(fp32, prompts):
    assert fp32["outputs"]["no marker"] == [None] * ACT_SIZE
    assert fp32["outputs"]["unknown type"] == [None] * (2 + ACT_SIZE)


def test_bf16_encoder_runs_an_fp32_head_close_to_the_reference(bf16, prompts):
    assert (bf16["encoder_dtype"], bf16["head_dtype"]) == (
        "torch.bfloat16",
        "torch.float32",
    )
    for name in ("noul", "choice", "one option", "past the window"):
        expected = reference_outputs(model_path("tiny-laya"), prompts[name])
        assert bf16["outputs"][name] == pytest.approx(expected, abs=0.05, rel=0.05), (
            name
        )
