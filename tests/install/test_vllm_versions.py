"""The overlay's reach across vLLM versions, checked statically: every ``vllm`` import it makes on each
version's code path resolves in that version's sources, and which patches apply to a version that can't
be installed here. vLLM 0.30.0 and 0.32.0 are installed (tools/test.sh's two environments, patched by
install.sh); 0.33.0 ships for GPUs only, so its wheel's sources are read from tools/env/vllm_sources.sh's
folder, which tools/test.sh fills. docs/install.md says what this does and does not verify."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ..conftest import MODELS, ROOT
from .test_install import release
from .vllm_imports import overlay_imports, unresolved

SOURCES_033 = (
    Path(os.environ.get("DECISIONS_VLLM_SOURCES", MODELS.parent / "vllm-sources"))
    / "0.33.0"
)
PATCHES = ROOT / "patches"
# vLLM 0.33.0, as found (docs/install.md): the fp32 read patches apply; the router patches don't (the CLI
# arguments module moved to vllm/entrypoints/common/cli_args.py, and run_batch.py and envs.py changed at
# their anchors), nor the Laya registry hunk; the canvas patch is 0.30's alone.
APPLIES_TO_033 = {
    "api-router-wire-v0.30.patch": False,
    "api-router-wire-v0.32.patch": False,
    "00584-laya-for-decision-v0.30.patch": False,
    "00584-laya-for-decision-v0.32.patch": False,
    "00572-diffusion-canvas-read-v0.30.patch": False,
    "exact-logprobs-v0.30.patch": True,
    "max-logprob-token-ids-v0.30.patch": True,
}
# The one import of the 0.32 code path that 0.33 lacks: it moved to vllm.entrypoints.common.cli_args.
UNRESOLVED_ON_033 = [
    "runtime/startup.py: no module vllm.entrypoints.launchers.cli_args"
]


def without_lines(found: list[str]) -> list[str]:
    """``file:line: what`` as ``file: what``, so an edit that moves a line doesn't fail the test."""
    return [re.sub(r"^([^:]+):\d+:", r"\1:", entry) for entry in found]


def sources_033() -> Path:
    if not (SOURCES_033 / ".complete").is_file():
        pytest.fail(
            f"no vLLM 0.33.0 sources in {SOURCES_033}: run tools/env/vllm_sources.sh 0.33.0"
        )
    return SOURCES_033


def applies(patch: Path, root: Path) -> bool:
    return (
        subprocess.run(
            ["patch", "-p1", "--dry-run", "-s", "-f", "--fuzz=0"],
            cwd=root,
            stdin=patch.open(),
            capture_output=True,
        ).returncode
        == 0
    )


@pytest.mark.parametrize("version", ["0.30.0", "0.32.0"])
def test_every_vllm_import_resolves_on_the_installed_versions(version):
    """Against the installed, patched vLLM: what the package imports there, with that version's switches."""
    major, minor = version.split(".")[:2]
    assert (
        unresolved(overlay_imports((int(major), int(minor))), release(version).site)
        == []
    )


def test_the_check_sees_a_moved_import():
    """0.30's code path against 0.32's sources: load_chat_template moved to vllm.renderers.chat_utils."""
    found = unresolved(overlay_imports((0, 30)), release("0.32.0").site)
    assert without_lines(found) == [
        "decide/vllm_versions.py: no module vllm.entrypoints.chat_utils"
    ]


def test_which_patches_apply_to_vllm_0_33():
    root = sources_033()
    assert {
        patch.name: applies(patch, root) for patch in sorted(PATCHES.glob("*.patch"))
    } == APPLIES_TO_033


def test_vllm_imports_on_vllm_0_33(tmp_path):
    """The 0.32 code path against 0.33's sources with the patches that apply there (they add the fp32 read)."""
    root = tmp_path / "vllm-0.33.0"
    shutil.copytree(sources_033(), root)
    for name, fits in APPLIES_TO_033.items():
        if fits:
            subprocess.run(
                ["patch", "-p1", "-s", "-f", "--fuzz=0"],
                cwd=root,
                stdin=(PATCHES / name).open(),
                check=True,
            )
    assert (
        without_lines(unresolved(overlay_imports((0, 33)), root)) == UNRESOLVED_ON_033
    )
