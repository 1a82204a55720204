"""Paths shared by every test layer."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "overlay" / "vllm" / "entrypoints" / "generate" / "decisions"
MODELS = Path(os.environ.get("DECISIONS_MODELS", Path.home() / ".cache" / "vllm-decisions" / "models"))


def model_path(name: str) -> Path:
    path = MODELS / name
    if not (path / ".complete").exists():
        pytest.fail(f"model {name} is missing from {MODELS}: run tools/env/setup.sh")
    return path


def _differences(a: filecmp.dircmp) -> list[str]:
    found = [*a.left_only, *a.right_only, *a.diff_files]
    for sub in a.subdirs.values():
        found += _differences(sub)
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    """Tests import the package installed in vLLM; refuse to test a stale copy of the checkout."""
    import vllm

    installed = Path(vllm.__file__).parent / "entrypoints" / "generate" / "decisions"
    if installed.resolve() == OVERLAY.resolve():
        return
    stale = _differences(filecmp.dircmp(OVERLAY, installed, ignore=["__pycache__"])) if installed.exists() else ["all"]
    if stale:
        raise pytest.UsageError(
            f"the overlay installed in vLLM differs from the checkout ({stale[:5]}): run ./install.sh"
        )
