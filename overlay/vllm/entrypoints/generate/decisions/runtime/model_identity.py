# SPDX-License-Identifier: Apache-2.0
"""What a saved startup check or calibration was measured on: everything that changes what a read returns.

A saved result is reused only on an exact key match, so the key must change whenever the reads could:
the model's files by content (config, tokenizer, weights), the tokenizer named by ``--tokenizer``, the
chat template and its kwargs as the server renders with them, the dtypes and quantization, and the vLLM
version. (The backend adds its options, what its startup check found and the prompt's render version;
calibration adds its own settings: runtime/calibration.py.)

Weights are hashed by content, streamed (SHA-256), and each file's hash is kept in the calibration folder
under its resolved path, size, mtime and ctime, so a restart hashes nothing again and a changed file is
hashed anew. A model that is no local folder (nor in the local Hugging Face cache) is keyed by its name
and revision alone, and the log says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)

# The files of a model folder that decide what it reads: configs and indexes, weights, tokenizer files,
# chat templates and remote code. Hidden files and the rest (README, images) are not read.
MODEL_FILE_SUFFIXES = (
    ".json",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".model",
    ".txt",
    ".jinja",
    ".py",
    ".tiktoken",
)
HASH_CACHE = "content-hashes.json"
BLOCK = 1 << 22


def model_files(folder: Path) -> list[Path]:
    """The files at the top of ``folder`` that decide what the model reads, by name."""
    return sorted(
        (
            path
            for path in folder.iterdir()
            if not path.name.startswith(".")
            and path.suffix in MODEL_FILE_SUFFIXES
            and path.is_file()
        ),
        key=lambda path: path.name,
    )


def file_sha256(path: Path, cache: dict[str, Any]) -> tuple[str, int]:
    """``path``'s SHA-256, from ``cache`` when its size, mtime and ctime are the ones hashed; and the
    bytes read for it now (0 from the cache)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
    held = cache.get(real)
    if (
        isinstance(held, dict)
        and held.get("stamp") == stamp
        and isinstance(held.get("sha256"), str)
    ):
        return held["sha256"], 0
    digest = hashlib.sha256()
    with open(real, "rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    cache[real] = {"stamp": stamp, "sha256": digest.hexdigest()}
    return digest.hexdigest(), stat.st_size


def folder_sha256(folder: Path, cache_dir: Path) -> str:
    """One SHA-256 over each model file's name and content hash; the file hashes are cached in
    ``cache_dir`` (a cache that can't be read or written only costs hashing again)."""
    cache_path = cache_dir / HASH_CACHE
    try:
        cache = json.loads(cache_path.read_text())
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    started, hashed = time.monotonic(), 0
    digest = hashlib.sha256()
    for path in model_files(folder):
        sha, read = file_sha256(path, cache)
        hashed += read
        digest.update(f"{path.name}\0{sha}\n".encode())
    if hashed:
        logger.info(
            "decision startup key: hashed %.0f MB of model files in %s (%.1f s; kept for the next start)",
            hashed / 1e6,
            folder,
            time.monotonic() - started,
        )
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            temporary = cache_path.with_suffix(f".tmp{os.getpid()}")
            temporary.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
            temporary.replace(cache_path)
        except OSError as exc:
            logger.warning(
                "decision startup key: can't keep the model files' hashes in %s: %s",
                cache_dir,
                exc,
            )
    return digest.hexdigest()


def local_folder(name: str, revision: str | None) -> Path | None:
    """The local folder of a model or tokenizer: the path itself, or its snapshot in the Hugging Face cache."""
    if os.path.isdir(name):
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, revision=revision, local_files_only=True))
    except Exception:  # not a hub id, or not downloaded: keyed by name and revision
        return None


def content_key(
    model: str,
    revision: str | None,
    tokenizer: str | None,
    tokenizer_revision: str | None,
    cache_dir: str,
) -> dict[str, Any]:
    """The model's files (and a separate ``--tokenizer``'s) by content; None where no local folder holds them."""
    key: dict[str, Any] = {}
    for name, (path, rev) in {
        "model": (model, revision),
        "tokenizer": (tokenizer, tokenizer_revision),
    }.items():
        if name == "tokenizer" and (path is None or path == model):
            continue
        folder = local_folder(str(path), rev)
        if folder is None:
            logger.warning(
                "decision startup key: %s %r is no local folder; saved results are keyed by its name "
                "and revision only",
                name,
                path,
            )
        key[f"{name}_files_sha256"] = (
            folder_sha256(folder, Path(cache_dir)) if folder is not None else None
        )
    return key


def chat_template_sha256(template: Any) -> str:
    """The chat template the server renders with, by content (None, a tokenizer without one, included)."""
    return hashlib.sha256(
        json.dumps(template, sort_keys=True, default=str).encode()
    ).hexdigest()


def deployment(
    model_config: Any,
    served_model: str,
    chat_template: Any,
    chat_template_kwargs: dict[str, Any],
    logit_dtype: str | None = None,
) -> dict[str, Any]:
    """What identifies the served model for saved startup work, short of its files' content
    (:func:`content_key`, added when the startup work begins)."""
    import vllm

    return {
        "model": served_model,
        "model_path": model_config.model,
        "revision": model_config.revision,
        "quantization": model_config.quantization,
        "dtype": str(model_config.dtype),
        "logit_dtype": logit_dtype,
        "tokenizer": getattr(model_config, "tokenizer", None),
        "tokenizer_revision": getattr(model_config, "tokenizer_revision", None),
        "tokenizer_mode": str(getattr(model_config, "tokenizer_mode", None)),
        "chat_template_sha256": chat_template_sha256(chat_template),
        "chat_template_kwargs": chat_template_kwargs,
        "vllm_version": vllm.__version__,
    }
