"""patches/00572 (the DiffusionGemma canvas read) against stock vLLM 0.30.0, as far as a CPU can check
it: it applies cleanly, every patched module imports, and the checks in canvas_patch_probe.py pass
(arguments and their errors, the read maths, the sampler's denoise step with a canvas read). The
engine path (Model Runner V2, Triton) needs a GPU; docs/canvas.md says how to check it there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..conftest import ROOT

CANVAS_PATCH = ROOT / "patches" / "00572-diffusion-canvas-read-v0.30.patch"
PROBE = Path(__file__).with_name("canvas_patch_probe.py")


def patched_tree(tmp_path: Path) -> Path:
    """A copy of the installed vllm package made of links, with the patch's files as real stock copies
    (the installed vLLM may carry the patch: it is taken out of the copies first), then patched."""
    import vllm

    site = tmp_path / "site"
    site.mkdir()
    subprocess.run(
        ["cp", "-rs", str(Path(vllm.__file__).parent), str(site / "vllm")], check=True
    )
    for line in CANVAS_PATCH.read_text().splitlines():
        if line.startswith("+++ b/") and (site / line[6:]).is_symlink():
            target = site / line[6:]
            real = target.resolve()
            target.unlink()
            shutil.copy(real, target)
    patch = ["patch", "-p1", "-s", "-f", "--fuzz=0"]
    if (
        subprocess.run(
            [*patch, "-R", "--dry-run"],
            cwd=site,
            stdin=CANVAS_PATCH.open(),
            capture_output=True,
        ).returncode
        == 0
    ):
        subprocess.run(
            [*patch, "-R", "-E"], cwd=site, stdin=CANVAS_PATCH.open(), check=True
        )
    applied = subprocess.run(
        patch, cwd=site, stdin=CANVAS_PATCH.open(), capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return site


def test_the_canvas_patch_applies_imports_and_its_cpu_parts_work(tmp_path):
    site = patched_tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site), "TORCH_COMPILE_DISABLE": "1"}
    imports = (
        "vllm.v1.sample.canvas_read",
        "vllm.sampling_params",
        "vllm.v1.engine.input_processor",
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.core.sched.async_scheduler",
        "vllm.model_executor.models.diffusion_gemma",
    )
    code = "import importlib, sys\nfor m in sys.argv[1:]: print(importlib.import_module(m).__file__)"
    imported = subprocess.run(
        [sys.executable, "-c", code, *imports],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    files = [
        line for line in imported.stdout.splitlines() if line.endswith(".py")
    ]  # vLLM logs to stdout too
    assert len(files) == len(imports) and all(f.startswith(str(site)) for f in files), (
        imported.stdout
    )
    probe = subprocess.run(
        [sys.executable, str(PROBE)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr[-3000:]
    assert [line for line in probe.stdout.splitlines() if line.startswith("ok ")] == [
        "ok arguments",
        "ok limits",
        "ok read_maths",
        "ok denoise_step",
    ]
