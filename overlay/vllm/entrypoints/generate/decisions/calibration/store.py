# SPDX-License-Identifier: Apache-2.0
"""Saved startup results: one JSON file per deployment and kind, reused only on an exact key match."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def path_for(directory: Path, key: dict[str, Any], kind: str = "calibration") -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
    return directory / f"{kind}-{digest.hexdigest()[:20]}.json"


def load(
    directory: Path, key: dict[str, Any], kind: str = "calibration"
) -> dict[str, Any] | None:
    """The saved result for exactly this key, or None."""
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
    """Atomically, so a crash mid-write never leaves a half file to be trusted later."""
    directory.mkdir(parents=True, exist_ok=True)
    path = path_for(directory, key, kind)
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    temporary.write_text(
        json.dumps({**record, "key": key}, indent=2, default=str) + "\n"
    )
    temporary.replace(path)
    return path
