"""Paths shared by every test layer."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "overlay" / "vllm" / "entrypoints" / "generate" / "decisions"
MODELS = Path(
    os.environ.get(
        "DECISIONS_MODELS", Path.home() / ".cache" / "vllm-decisions" / "models"
    )
)


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
    stale = (
        _differences(filecmp.dircmp(OVERLAY, installed, ignore=["__pycache__"]))
        if installed.exists()
        else ["all"]
    )
    if stale:
        raise pytest.UsageError(
            f"the overlay installed in vLLM differs from the checkout ({stale[:5]}): run ./install.sh"
        )


# Test files that use a session server (tests/server/conftest.py: ``server``, ``tiny_qwen_server``). Under
# pytest-xdist (tools/test.sh) they all run on one worker: each server starts once, its memory is held once
# (a 24 GiB machine ran out with two copies of each), and no other file's requests reach it while a test
# counts its metrics. pytest_collection_modifyitems keeps this list true.
ON_SESSION_SERVERS = frozenset(
    f"tests/server/test_{name}.py"
    for name in (
        "amplification",
        "auth",
        "bulk",
        "bytes",
        "canvas",
        "disconnects",
        "endpoints",
        "faults",
        "fuzz",
        "hostile",
        "load",
        "metrics",
        "plugins",
        "quality",
        "ray_data",
        "readouts",
        "sdks",
        "stencil",
        "vllm_handling",
        "wire_contract",
    )
)
SESSION_SERVERS = frozenset({"server", "tiny_qwen_server"})


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """pytest-xdist's scheduling by scope, where a scope is a test file or ON_SESSION_SERVERS as one."""
    from xdist.scheduler import LoadScopeScheduling

    class BySessionServer(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            return "session servers" if file in ON_SESSION_SERVERS else file

    return BySessionServer(config, log)


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    for item in items:
        file = item.nodeid.split("::")[0]
        if (
            SESSION_SERVERS & set(getattr(item, "fixturenames", ()))
            and file not in ON_SESSION_SERVERS
        ):
            raise pytest.UsageError(
                f"{file} uses a session server: add it to ON_SESSION_SERVERS in tests/conftest.py"
            )


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (tools/test.sh runs two workers), each worker's vLLM engines run on cores of their
    own. Left at ``auto``, vLLM binds every engine on a 2-core machine to core 0 (the other is kept for the
    API server), and the two workers would take turns on it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    workers, index = (
        int(os.environ["PYTEST_XDIST_WORKER_COUNT"]),
        int(worker.removeprefix("gw")),
    )
    cores = sorted(os.sched_getaffinity(0))
    mine = cores[
        index * len(cores) // workers : (index + 1) * len(cores) // workers
    ] or [cores[index % len(cores)]]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))


def engine_binding(replicas: int) -> dict[str, str]:
    """The environment for an engine with ``replicas`` data-parallel ranks on this worker's cores (vLLM
    takes one core list per rank); empty when not bound by pytest_configure."""
    cores = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    return (
        {}
        if cores in ("auto", "nobind")
        else {"VLLM_CPU_OMP_THREADS_BIND": "|".join([cores] * replicas)}
    )
