# SPDX-License-Identifier: Apache-2.0
"""What a saved startup check or calibration was measured on: everything that changes what a read
returns, since a saved result is reused only on an exact key match. File hashes are kept by resolved
path, size, mtime and ctime, so a restart hashes nothing again."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)

# The files of a model folder that decide what it reads (not hidden ones, README, images).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
TOKENIZER_SUFFIXES = (".model", ".tiktoken", ".txt", ".jinja")  # and chat templates
MODEL_FILE_SUFFIXES = (*WEIGHT_SUFFIXES, *TOKENIZER_SUFFIXES, ".json", ".py")
HASH_CACHE = "content-hashes.json"
BLOCK = 1 << 22


def file_sha256(path: Path, cache: dict[str, Any]) -> tuple[str, int]:
    """``path``'s SHA-256 (from ``cache`` when its stamp matches) and the bytes read for it now."""
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
    """One SHA-256 over the model files' names and hashes (a cache that fails only costs hashing)."""
    cache_path = cache_dir / HASH_CACHE
    try:
        cache = json.loads(cache_path.read_text())
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    started, hashed = time.monotonic(), 0
    digest = hashlib.sha256()
    files = sorted(
        path
        for path in folder.iterdir()
        if not path.name.startswith(".")
        and path.suffix in MODEL_FILE_SUFFIXES
        and path.is_file()
    )
    for path in files:
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
    """The path itself, or its snapshot in the Hugging Face cache."""
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
    """The model's (and a separate tokenizer's) files by content; None where no local folder has them."""
    key: dict[str, Any] = {}
    targets = {"model": (model, revision)}
    if tokenizer is not None and tokenizer != model:
        targets["tokenizer"] = (tokenizer, tokenizer_revision)
    for name, (path, rev) in targets.items():
        if (folder := local_folder(str(path), rev)) is None:
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


def deployment(
    model_config: Any,
    served_model: str,
    chat_template: Any,
    chat_template_kwargs: dict[str, Any],
    logit_dtype: str | None = None,
) -> dict[str, Any]:
    """The served model's key for saved startup work, short of :func:`content_key`."""
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
        "chat_template_sha256": hashlib.sha256(
            json.dumps(chat_template, sort_keys=True, default=str).encode()
        ).hexdigest(),
        "chat_template_kwargs": chat_template_kwargs,
        "vllm_version": vllm.__version__,
    }
