"""A throwaway `vllm serve` with decisions on, for the tools that measure one (bench.py, soak.py),
or a running server they target instead."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/vllm-decisions/models/smollm2-135m-instruct"
)


def add_server_arguments(
    parser: argparse.ArgumentParser, pid_for: str, dtype: str | None = None
) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument(
        "--dtype",
        default=dtype or cpu_dtype(),
        help="the started server's dtype (%(default)s)",
    )
    parser.add_argument(
        "--port", type=int, help="target a running server instead of starting one"
    )
    parser.add_argument(
        "--server-pid",
        type=int,
        help=f"with --port: the API server's PID, for {pid_for}",
    )


def cpu_dtype() -> str:
    """bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX), float32 elsewhere: on an
    AVX2-only CPU vLLM's bf16 matmuls are emulated, about five times slower (tools/serve.sh decides alike)."""
    flags = (
        Path("/proc/cpuinfo").read_text().split()
        if Path("/proc/cpuinfo").exists()
        else []
    )
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def engine_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a measured vLLM process: decisions on, offline, a 2 GiB KV cache unless set."""
    return {
        **os.environ,
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        **(env or {}),
    }


def engine_args(dtype: str | None = None) -> list[str]:
    """The engine arguments every measured vLLM process (serve and run-batch) shares; the tools' requests
    name the model "m", the name it is served under."""
    return [
        "--served-model-name",
        "m",
        "--max-model-len",
        "8192",
        "--enable-prefix-caching",
        "--enforce-eager",
        "--block-size",
        "32",
        "--dtype",
        dtype or cpu_dtype(),
    ]


def serve(
    model: str,
    port: int,
    calibration_dir: str,
    log: Path,
    env: dict[str, str] | None = None,
    dtype: str | None = None,
    args: list[str] | None = None,
) -> subprocess.Popen:
    env = engine_env(
        {"VLLM_TYPED_DECISIONS_CALIBRATION_DIR": calibration_dir, **(env or {})}
    )
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "serve",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *engine_args(dtype),
        *(args or []),
    ]
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    """--api-key, for a running server (--port) started with one; VLLM_API_KEY by default, as
    ``vllm serve`` reads it."""
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="with --port: the server's key (default: VLLM_API_KEY)",
    )


def key_headers(api_key: str | None) -> dict[str, str]:
    """What a request to a server started with ``--api-key`` (or ``VLLM_API_KEY``) must carry."""
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


async def served_model(http: httpx.AsyncClient) -> str:
    """The name the server at ``http`` serves its model under (``/v1/models``): what a request's
    ``model`` names, "m" for the servers these tools start, whatever an operator chose for theirs."""
    response = await http.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def on_first_pass(response: httpx.Response) -> bool:
    """Whether a decision response was answered on a calibration's first pass."""
    if response.status_code != 200:
        return False
    answers = response.json().get("answers", {})
    return any(
        (a.get("extra") or {}).get("audit", {}).get("calibration_stage") == "first pass"
        for a in answers.values()
    )


async def wait_ready(
    url: str, seconds: float = 1800, headers: dict[str, str] | None = None
) -> None:
    """Until a decision request is answered on the full calibration: not a 503 (the startup
    calibration), nor an answer on a first pass that the full calibration will replace. The request
    names the model the server serves, whatever its name (``/v1/models``, up before decisions are).
    A server that refuses the key (none, or the wrong one) ends the wait at once."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http:
        while True:
            try:
                probe = {
                    "model": await served_model(http),
                    "state": "x",
                    "questions": {"q": {"type": "noul", "instructions": "?"}},
                }
                response = await http.post("/v1/systemone", json=probe)
                if response.status_code != 503 and not on_first_pass(response):
                    return
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code in (401, 403):
                    raise SystemExit(
                        f"{url} refused the API key ({exc.response.status_code}): give the "
                        "server's key with --api-key or VLLM_API_KEY"
                    ) from None
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no decision answer from {url} within {seconds:.0f} s"
                )
            await asyncio.sleep(2)


def startup_seconds(url: str, process: subprocess.Popen) -> float:
    """Seconds from /health answering to the first answered decision."""
    probe = {
        "model": "m",
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "?"}],
    }
    health_at = None
    while True:
        if process.poll() is not None:
            raise RuntimeError("vllm serve exited during startup")
        try:
            if (
                health_at is None
                and httpx.get(f"{url}/health", timeout=5).status_code == 200
            ):
                health_at = time.perf_counter()
            if (
                health_at is not None
                and httpx.post(
                    f"{url}/v1/decisions", json=probe, timeout=60
                ).status_code
                == 200
            ):
                return time.perf_counter() - health_at
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def api_and_engine(
    pid: int | None, measure: Callable[[psutil.Process], float]
) -> tuple[float, float]:
    """``measure`` of the API-server process, and summed over the engine processes it started
    (0, 0 when no PID is known)."""
    if not pid:
        return 0.0, 0.0
    root = psutil.Process(pid)
    engine = 0.0
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            engine += measure(child)
    return measure(root), engine


@contextmanager
def target(
    args: argparse.Namespace, port: int, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int | None]]:
    """(url, API-server PID) of the server ``--port`` names, or of one started here (with ``env``
    added to its environment) and stopped after; if the work fails, the end of its log is printed."""
    if args.port:
        yield f"http://127.0.0.1:{args.port}", args.server_pid
        return
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "serve.log"
        process = serve(args.model, port, folder, log, env, args.dtype)
        try:
            startup_seconds(url, process)
            yield url, process.pid
        except BaseException:
            # the log goes with the folder: its end is what says why the server failed
            print(*log.read_text().splitlines()[-40:], sep="\n", file=sys.stderr)
            raise
        finally:
            stop(process)
