# SPDX-License-Identifier: Apache-2.0
"""Saved calibration results: one small JSON file per deployment, reused only on an exact key match.

The key covers everything that changes the scores: the model (name, revision, quantization), the
backend and its startup arguments, the prompt's render version and the question file's content.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(key, sort_keys=True, default=str).encode()
    ).hexdigest()


def path_for(directory: Path, key: dict[str, Any], kind: str = "calibration") -> Path:
    return directory / f"{kind}-{key_digest(key)[:20]}.json"


def lock_path(directory: Path, key: dict[str, Any], kind: str = "calibration") -> Path:
    """The lock beside a saved result, held by the one API-server process producing it."""
    return path_for(directory, key, kind).with_suffix(".lock")


def load(
    directory: Path, key: dict[str, Any], kind: str = "calibration"
) -> dict[str, Any] | None:
    """The saved result for exactly this key, or None (missing, unreadable or for another key)."""
    try:
        record = json.loads(path_for(directory, key, kind).read_text())
    except (OSError, ValueError):
        return None
    return (
        record
        if isinstance(record, dict)
        and record.get("key") == json.loads(json.dumps(key, default=str))
        else None
    )


def save(
    directory: Path,
    key: dict[str, Any],
    record: dict[str, Any],
    kind: str = "calibration",
) -> Path:
    """Write atomically, so a crash mid-write never leaves a half file to be trusted later."""
    directory.mkdir(parents=True, exist_ok=True)
    path = path_for(directory, key, kind)
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    temporary.write_text(
        json.dumps({**record, "key": key}, indent=2, default=str) + "\n"
    )
    temporary.replace(path)
    return path
