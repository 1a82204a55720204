"""The Laya checkpoint layout (docs/laya-checkpoint.md): the tiny build meets it, the plain reference
computes what Laya's own model computes, and the converter from Laya's published layout is faithful."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tools.env import convert_laya_checkpoint

from ..conftest import OVERLAY, model_path
from ..laya_reference import reference_outputs

STATE = (
    "hello, my order arrived late and the box was damaged. please send a refund today, thanks! "
    * 2
)
QUESTIONS: list[dict[str, Any]] = [
    {"t": "noul", "ins": "is the customer angry?", "crit": {"true": "they complain"}},
    {
        "t": "choice",
        "ins": "which team",
        "crit": {"billing": "invoice or refund", "support": "help", "spam": None},
    },
    {
        "t": "score",
        "ins": "how urgent is it",
        "crit": ["low", "medium", "high", "critical"],
    },
    {"t": "choice", "ins": "only one", "crit": {"ok": "fine"}},
]


@pytest.fixture(scope="module")
def tiny() -> Path:
    return model_path("tiny-laya")


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def build_prompt():
    spec = importlib.util.spec_from_file_location(
        "laya_prompts", OVERLAY / "decide/backends/encoder/laya_prompts.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_prompt


def render(question: dict) -> list[str]:
    """Options as Laya renders them (noul: false then true; choice: label: description; score: level i)."""
    crit = question["crit"]
    if question["t"] == "choice":
        return [
            label if text is None else f"{label}: {text}"
            for label, text in crit.items()
        ]
    if question["t"] == "score":
        return [f"level {i}: {text}" for i, text in enumerate(crit)]
    return [
        "false: " + crit.get("false", "no, the statement does not hold"),
        "true: " + crit.get("true", "yes, the statement holds"),
    ]


def prompt(build_prompt, tokenizer, question: dict) -> tuple[list[int], list[int]]:
    return build_prompt(
        tokenizer,
        STATE,
        question["t"],
        question["ins"],
        render(question),
        max_len=512,
        head_max_len=192,
        option_max_tokens=48,
    )


def schema_head_shapes(d: int, laya: dict) -> dict[str, tuple[int, ...]]:
    """The head's weights as the converter checks them; laya's own model loads the same names strictly
    in the reference test below, so a wrong table here fails there."""
    return convert_laya_checkpoint.head_shapes(d, laya)


# --- (a) the tiny build meets the schema ---------------------------------------------------------------


def test_tiny_checkpoint_has_every_weight_of_the_schema_in_fp32(tiny):
    from transformers import ModernBertConfig, ModernBertModel

    document = json.loads((tiny / "config.json").read_text())
    assert (
        document["architectures"] == ["LayaForDecision"]
        and document["model_type"] == "modernbert"
    )
    config = ModernBertConfig.from_pretrained(tiny)
    assert (
        config.layer_types == ["full_attention", "sliding_attention"]
        and config.local_attention == 16
    )
    with torch.device("meta"):
        encoder = ModernBertModel(config).state_dict()
    wanted = {f"encoder.{k}": tuple(v.shape) for k, v in encoder.items()}
    wanted |= schema_head_shapes(config.hidden_size, document["laya_config"])
    found = load_file(str(tiny / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in found.items()} == wanted
    assert {v.dtype for v in found.values()} == {torch.float32}
    assert (tiny / "laya_prompts.py").read_bytes() == (
        OVERLAY / "decide/backends/encoder/laya_prompts.py"
    ).read_bytes()


def test_tiny_laya_config_matches_its_tokenizer(tiny, tokenizer):
    laya = json.loads((tiny / "config.json").read_text())["laya_config"]
    assert laya["question_types"] == {"choice": 0, "score": 1, "noul": 2}
    assert (
        laya["mask_token_id"]
        == tokenizer.mask_token_id
        == tokenizer.convert_tokens_to_ids("[MASK]")
    )
    assert tokenizer.pad_token_id == 0
    assert None not in (
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.mask_token,
    )
    for word, token_id in laya["question_type_token_ids"].items():
        assert tokenizer.tokenize(word) == [word]
        assert (
            tokenizer.encode(f"{word} question: x", add_special_tokens=False)[0]
            == token_id
        )
    assert tokenizer.tokenize("question") == ["question"]
    assert (tiny / "special_tokens_map.json").is_file()


def test_options_score_visibly_apart(tiny, tokenizer, build_prompt):
    ids, markers = prompt(build_prompt, tokenizer, QUESTIONS[1])
    scores = reference_outputs(tiny, ids)[: len(markers)]
    assert max(scores) - min(scores) > 0.1


def test_nothing_to_decide_is_nan_everywhere(tiny, tokenizer, build_prompt):
    act_size = json.loads((tiny / "config.json").read_text())["laya_config"]["act_size"]
    ids, markers = prompt(build_prompt, tokenizer, QUESTIONS[0])
    unknown_type = [ids[0], tokenizer.convert_tokens_to_ids("hello"), *ids[2:]]
    assert len(reference_outputs(tiny, unknown_type)) == len(markers) + act_size
    assert all(math.isnan(x) for x in reference_outputs(tiny, unknown_type))
    no_marker = [t for t in ids if t != tokenizer.mask_token_id]
    assert len(reference_outputs(tiny, no_marker)) == act_size
    assert all(math.isnan(x) for x in reference_outputs(tiny, no_marker))


# --- (b) the reference is Laya's own model -------------------------------------------------------------


def laya_outputs(
    checkpoint: Path, rows: list[tuple[list[int], list[int], int]]
) -> list[list[float]]:
    """Laya's DecisionModel on one padded batch, cut back to each row's k scores and act scores."""
    common = pytest.importorskip(
        "laya.common", reason="laya==0.4.15 (tools/env/requirements-dev.txt) is missing"
    )
    laya = json.loads((checkpoint / "config.json").read_text())["laya_config"]
    act_costs = {f"act{i}": 1.0 for i in range(laya["act_size"] - 1)}
    model = common.build_model(
        {"head_layers": laya["head_layers"], "act_costs": act_costs},
        encoder_dir=str(checkpoint),
        pretrained=False,
    )
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=True)
    model.eval()
    length, k = max(len(ids) for ids, _, _ in rows), max(len(m) for _, m, _ in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention = torch.zeros_like(ids)
    marker_pos = torch.zeros(len(rows), k, dtype=torch.long)
    marker_mask = torch.zeros(len(rows), k, dtype=torch.bool)
    for i, (row_ids, markers, _) in enumerate(rows):
        ids[i, : len(row_ids)], attention[i, : len(row_ids)] = torch.tensor(row_ids), 1
        marker_pos[i, : len(markers)], marker_mask[i, : len(markers)] = (
            torch.tensor(markers),
            True,
        )
    with torch.no_grad():
        logits, act = model(
            ids,
            attention,
            marker_pos,
            marker_mask,
            torch.tensor([q for _, _, q in rows]),
        )
    return [
        [*logits[i, : len(m)].tolist(), *act[i].tolist()]
        for i, (_, m, _) in enumerate(rows)
    ]


@pytest.mark.parametrize(
    "batch", [[0], [3], [0, 1, 2, 3]], ids=["noul", "one-option", "mixed-option-counts"]
)
def test_reference_equals_laya(tiny, tokenizer, build_prompt, batch):
    rows = []
    for index in batch:
        ids, markers = prompt(build_prompt, tokenizer, QUESTIONS[index])
        rows.append(
            (ids, markers, {"choice": 0, "score": 1, "noul": 2}[QUESTIONS[index]["t"]])
        )
    for (ids, _, _), theirs in zip(rows, laya_outputs(tiny, rows), strict=True):
        # longer than the sliding window, so both attention kinds matter
        assert len(ids) > 2 * 16
        torch.testing.assert_close(
            torch.tensor(reference_outputs(tiny, ids)),
            torch.tensor(theirs),
            rtol=1e-5,
            atol=1e-5,
        )


def test_builtin_prompts_match_laya_sequences(tokenizer, build_prompt):
    common = pytest.importorskip(
        "laya.common", reason="laya==0.4.15 (tools/env/requirements-dev.txt) is missing"
    )
    for question in QUESTIONS:
        assert render(question) == common.render_options(question)
        assert prompt(build_prompt, tokenizer, question) == tuple(
            common.build_sequence(tokenizer, STATE, question)
        )


# --- (c, d) the converter ------------------------------------------------------------------------------


def published(tiny: Path, folder: Path, **agent_overrides) -> Path:
    """The tiny checkpoint re-laid the way Laya publishes one."""
    from transformers import ModernBertConfig

    document = json.loads((tiny / "config.json").read_text())
    laya = document["laya_config"]
    folder.mkdir()
    (folder / "encoder").mkdir()
    ModernBertConfig.from_pretrained(tiny).save_pretrained(folder / "encoder")
    shutil.copytree(
        tiny,
        folder / "tokenizer",
        ignore=shutil.ignore_patterns("config.json", "model.*", "*.py", ".*"),
    )
    shutil.copyfile(tiny / "model.safetensors", folder / "model.safetensors")
    agent = {
        "encoder": "tiny-modernbert",
        "max_len": laya["max_len"],
        "head_max_len": laya["head_max_len"],
        "head_layers": laya["head_layers"],
        "act_costs": {"ask": 0.1, "abstain": 0.2},
        "temperature": laya["temperature"],
        "temperature_by_options": laya["temperature_by_options"],
        **agent_overrides,
    }
    (folder / "rl_agent_config.json").write_text(json.dumps(agent))
    return folder


@pytest.fixture(scope="module")
def converter():
    return convert_laya_checkpoint


@pytest.fixture
def convert(converter, capsys):
    """The converter's command line, in process: (exit status, what it printed on stderr)."""

    def run(*args: Path | str) -> tuple[int, str]:
        status = converter.main([str(a) for a in args])
        return status, capsys.readouterr().err

    return run


def test_convert_round_trip(tiny, tokenizer, build_prompt, convert, tmp_path):
    src = published(tiny, tmp_path / "published")
    status, err = convert(src, tmp_path / "ours")
    assert status == 0, err
    ours = tmp_path / "ours"
    assert not (ours / "laya_prompts.py").exists()
    converted = json.loads((ours / "config.json").read_text())
    original = json.loads((tiny / "config.json").read_text())
    assert converted["architectures"] == ["LayaForDecision"]
    assert converted["laya_config"] == original["laya_config"]
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(ours).mask_token_id == tokenizer.mask_token_id
    for question in QUESTIONS:
        ids, _ = prompt(build_prompt, tokenizer, question)
        assert reference_outputs(ours, ids) == reference_outputs(tiny, ids)
    assert convert(src, tmp_path / "with-prompts", "--prompts")[0] == 0
    assert (tmp_path / "with-prompts" / "laya_prompts.py").is_file()


def test_converter_refuses_the_parallel_layout(tiny, convert, tmp_path):
    status, err = convert(
        published(tiny, tmp_path / "published", option_layout="parallel"),
        tmp_path / "ours",
    )
    assert status != 0 and "parallel" in err
    assert not (tmp_path / "ours").exists()


def test_converter_refuses_weights_that_disagree_with_the_config(
    tiny, convert, tmp_path
):
    # act head has 3 rows, not 2
    src = published(tiny, tmp_path / "published", act_costs={"ask": 0.1})
    status, err = convert(src, tmp_path / "ours")
    assert status != 0 and "act_head.2.weight" in err


def test_converter_refuses_a_missing_file(tiny, convert, tmp_path):
    src = published(tiny, tmp_path / "published")
    (src / "encoder" / "config.json").unlink()
    status, err = convert(src, tmp_path / "ours")
    assert status != 0 and "encoder/config.json" in err


def test_convert_respells_an_encoder_config_saved_by_transformers_4(
    tiny, tokenizer, build_prompt, convert, tmp_path
):
    src = published(tiny, tmp_path / "published")
    encoder = json.loads((src / "encoder" / "config.json").read_text())
    rope = encoder.pop("rope_parameters")
    del encoder["layer_types"]
    encoder |= {
        "global_attn_every_n_layers": 2,
        "reference_compile": None,
        "torch_dtype": "float32",
    }
    encoder |= {"global_rope_theta": rope["full_attention"]["rope_theta"]}
    encoder |= {"local_rope_theta": rope["sliding_attention"]["rope_theta"]}
    (src / "encoder" / "config.json").write_text(json.dumps(encoder))
    status, err = convert(src, tmp_path / "ours")
    assert status == 0, err
    converted = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert converted["layer_types"] == ["full_attention", "sliding_attention"]
    assert converted["rope_parameters"] == rope
    ids, _ = prompt(build_prompt, tokenizer, QUESTIONS[2])
    assert reference_outputs(tmp_path / "ours", ids) == reference_outputs(tiny, ids)
