"""An honest calibration key (calibration/run.calibration_key, model_identity.py): every ingredient that changes
what a read returns gives a new key, so a saved calibration is never reused for another model, template,
tokenizer, vLLM, read precision, threshold or prompt; and the model's files count by content, hashed once."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.runtime import model_identity

from .fakes import ScriptedBackend
from .test_calibration_startup import overconfident, write_questions

CONFIG = SimpleNamespace(
    model="/models/m",
    revision=None,
    quantization=None,
    dtype="torch.bfloat16",
    tokenizer="/models/m",
    tokenizer_revision=None,
    tokenizer_mode="auto",
)
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def deployment(**changed):
    parts = {
        "model_config": CONFIG,
        "served_model": "m",
        "chat_template": TEMPLATE,
        "chat_template_kwargs": {"add_generation_prompt": True},
        "logit_dtype": "bfloat16",
    } | changed
    return model_identity.deployment(**parts)


class KeyedBackend(ScriptedBackend):
    """A scripted backend whose startup check found ``facts`` (read_key)."""

    def __init__(self, facts, render_version="scripted-1"):
        super().__init__(lambda q: self.reads.append(q) or overconfident(q))
        self.reads = []
        self.facts = facts
        self.render_version = render_version  # type: ignore[misc]

    def read_key(self):
        return dict(self.facts)


def settings(tmp_path, source, **extra):
    env = {
        "VLLM_TYPED_DECISIONS_CALIBRATION": str(source),
        "VLLM_TYPED_DECISIONS_CALIBRATION_DIR": str(tmp_path / "saved"),
        "VLLM_TYPED_DECISIONS_PRIOR": "off",
    }
    return Settings.from_env(
        env | {f"VLLM_TYPED_DECISIONS_{k}": v for k, v in extra.items()}
    )


def test_the_deployment_names_template_kwargs_tokenizer_dtypes_and_vllm(monkeypatch):
    base = deployment()
    changes = [
        deployment(chat_template=TEMPLATE + " "),
        deployment(chat_template=None),
        deployment(
            chat_template_kwargs={
                "add_generation_prompt": True,
                "enable_thinking": False,
            }
        ),
        deployment(
            model_config=SimpleNamespace(
                **{**vars(CONFIG), "tokenizer": "/tokenizers/other"}
            )
        ),
        deployment(
            model_config=SimpleNamespace(**{**vars(CONFIG), "tokenizer_mode": "slow"})
        ),
        deployment(
            model_config=SimpleNamespace(**{**vars(CONFIG), "dtype": "torch.float16"})
        ),
        deployment(logit_dtype="float32"),
    ]
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.0.1-other")
    changes.append(deployment())
    keys = [json.dumps(key, sort_keys=True) for key in (base, *changes)]
    assert len(set(keys)) == len(keys), "each ingredient changes the deployment"
    monkeypatch.undo()
    assert deployment() == base, "the same deployment, the same key"


async def test_each_ingredient_is_a_new_calibration(tmp_path):
    source = write_questions(tmp_path / "q.jsonl", 120)
    model = {**deployment(), "model_files_sha256": "a" * 64}
    facts = {"fp32_reads": True, "word_reads": True}
    backend = KeyedBackend(facts)
    await startup_calibration(backend, settings(tmp_path, source), model)
    assert len(backend.reads) == 120
    saved = tmp_path / "saved"
    assert len(list(saved.glob("calibration-*.json"))) == 1
    (record,) = (json.loads(p.read_text()) for p in saved.glob("calibration-*.json"))
    key = record["key"]
    for part in (
        "chat_template_sha256",
        "chat_template_kwargs",
        "tokenizer",
        "vllm_version",
        "model_files_sha256",
        "min_option_mass",
        "render_version",
        "backend_options",
    ):
        assert part in key, part
    assert key["reads"] == facts

    await startup_calibration(KeyedBackend(facts), settings(tmp_path, source), model)
    assert len(list(saved.glob("calibration-*.json"))) == 1, (
        "the same ingredients reuse the saved calibration"
    )

    variants = [
        (
            KeyedBackend(facts),
            settings(tmp_path, source),
            {**model, "model_files_sha256": "b" * 64},
        ),
        (
            KeyedBackend(facts),
            settings(tmp_path, source),
            {**model, **deployment(chat_template="other")},
        ),
        (
            KeyedBackend(facts),
            settings(tmp_path, source),
            {**model, **deployment(chat_template_kwargs={})},
        ),
        (
            KeyedBackend({**facts, "fp32_reads": False}),
            settings(tmp_path, source),
            model,
        ),
        (KeyedBackend(facts), settings(tmp_path, source, MIN_OPTION_MASS="0.3"), model),
        (
            KeyedBackend(facts, render_version="scripted-2"),
            settings(tmp_path, source),
            model,
        ),
    ]
    for count, (backend, configured, key_parts) in enumerate(variants, start=2):
        await startup_calibration(backend, configured, key_parts)
        assert len(backend.reads) == 120, f"variant {count - 1} measured anew"
        assert len(list(saved.glob("calibration-*.json"))) == count


def weights_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (folder / "model.safetensors").write_bytes(b"\x00" * 4096)
    (folder / "README.md").write_text("about the model")
    return folder


def files_key(folder, cache):
    return model_identity.content_key(str(folder), None, str(folder), None, str(cache))[
        "model_files_sha256"
    ]


def test_model_files_count_by_content_not_by_name_size_or_mtime(tmp_path):
    folder, cache = weights_folder(tmp_path), tmp_path / "saved"
    first = files_key(folder, cache)
    (folder / "README.md").write_text("edited notes")
    assert files_key(folder, cache) == first, (
        "a file that doesn't decide the reads is not part of the key"
    )
    weights = folder / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(b"\x01" + b"\x00" * 4095)  # same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    assert files_key(folder, cache) != first, (
        "changed weights are a new key, whatever their size and mtime say"
    )
    (folder / "config.json").write_text('{"hidden_size": 9}')
    assert files_key(folder, cache) != first


def test_file_hashes_are_kept_and_redone_when_a_file_changes(tmp_path):
    folder, cache = weights_folder(tmp_path), tmp_path / "saved"
    first = files_key(folder, cache)
    kept = json.loads((cache / model_identity.HASH_CACHE).read_text())
    weights = os.path.realpath(folder / "model.safetensors")
    assert set(kept) == {
        os.path.realpath(folder / name)
        for name in ("config.json", "model.safetensors.index.json", "model.safetensors")
    }
    # A kept hash is used as it is (nothing is read again) ...
    kept[weights]["sha256"] = "0" * 64
    (cache / model_identity.HASH_CACHE).write_text(json.dumps(kept))
    assert files_key(folder, cache) != first
    # ... until the file is touched: then it is hashed again.
    os.utime(weights)
    assert files_key(folder, cache) == first


def test_a_model_that_is_no_local_folder_is_keyed_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    key = model_identity.content_key(
        "org/not-downloaded", None, "org/not-downloaded", None, str(tmp_path)
    )
    assert key == {"model_files_sha256": None}


def test_a_separate_tokenizer_counts_by_content(tmp_path):
    folder, cache = weights_folder(tmp_path), tmp_path / "saved"
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text('{"model": 1}')
    key = model_identity.content_key(
        str(folder), None, str(tokenizer), None, str(cache)
    )
    (tokenizer / "tokenizer.json").write_text('{"model": 2}')
    assert (
        model_identity.content_key(str(folder), None, str(tokenizer), None, str(cache))
        != key
    )
    assert key["model_files_sha256"] and key["tokenizer_files_sha256"]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct"])
def test_hashing_a_real_model_folder(tmp_path, name):
    """The local test model's files, hashed cold then from the kept hashes (times in docs/calibration.md)."""
    from ..conftest import model_path

    folder = model_path(name)
    cold = files_key(folder, tmp_path)
    assert files_key(folder, tmp_path) == cold
