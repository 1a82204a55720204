"""One real ``vllm serve`` per test session, with the overlay as installed by install.sh."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ..conftest import model_path

# A hang detector, not a speed check: a startup calibration takes minutes on a CPU without AVX-512.
START_TIMEOUT_S = 900
# SmolLM2 is served with its full context, as tools/serve.sh does: a 255-option choice with short
# descriptions needs more than 4,096 tokens. The tiny test models exercise engine paths, not long
# prompts, and keep a short one.
CONTEXT = {"smollm2-135m-instruct": 8192}
SHORT_CONTEXT = 2048
# Each server's KV cache, sized to its context: SmolLM2 holds 46 KB a token in float32, so 512 MiB is
# about 11,600 tokens; the other test models need far less for theirs. vLLM's CPU setting
# (VLLM_CPU_KVCACHE_SPACE) counts whole GiB: 1 GiB per server, resident from startup, ran a 23 GiB
# machine out of memory where the suite holds about seven servers at once.
KV_CACHE_BYTES = {"smollm2-135m-instruct": 512 << 20}
SHORT_KV_CACHE_BYTES = 256 << 20
# float32 unless a test needs the bf16 path: on a CPU without AVX-512 BF16 (CI's AMD EPYC with AVX2 only)
# vLLM's bf16 matmuls are emulated, about five times slower than float32 for SmolLM2. The bf16 read path
# is tested where it is the point: tests/engine/test_exact_logprobs.py (SmolLM2) and
# tests/server/test_templates.py (three families served in bf16).
DTYPE = "float32"
# The name test servers serve their model under (vLLM's --served-model-name), which requests name, as a
# user names the model they serve; a server given a name of its own keeps it.
SERVED_NAME = "m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """A ``vllm serve`` child process on CPU, stopped by its own PID."""

    def __init__(
        self,
        model: Path,
        log: Path,
        env: dict[str, str],
        *args: str,
        dtype: str = DTYPE,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # The name requests give the model, and /v1/models lists.
        self.model = (
            args[args.index("--served-model-name") + 1]
            if "--served-model-name" in args
            else SERVED_NAME
        )
        named = (
            ()
            if "--served-model-name" in args
            else ("--served-model-name", SERVED_NAME)
        )
        command = [
            str(Path(sys.executable).parent / "vllm"),
            "serve",
            str(model),
            *named,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            dtype,
            "--enforce-eager",
            "--block-size",
            "32",
            "--max-model-len",
            str(CONTEXT.get(model.name, SHORT_CONTEXT)),
            "--enable-prefix-caching",
            "--kv-cache-memory-bytes",
            str(KV_CACHE_BYTES.get(model.name, SHORT_KV_CACHE_BYTES)),
            *args,
        ]
        full_env = {
            **{
                k: v
                for k, v in os.environ.items()
                # VLLM_CPU_KVCACHE_SPACE (tools/test.sh sets it) would override the size above
                if not k.startswith(("VLLM_TYPED", "VLLM_ENABLE_TYPED"))
                and k != "VLLM_CPU_KVCACHE_SPACE"
            },
            "HF_HUB_OFFLINE": "1",
            "TORCH_COMPILE_DISABLE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            # Startup calibration is tested on its own (test_calibration.py); elsewhere it only costs time.
            "VLLM_TYPED_DECISIONS_CALIBRATION": "off",
            **env,
        }
        self.handle = log.open("w")
        self.process = subprocess.Popen(
            command, env=full_env, stdout=self.handle, stderr=subprocess.STDOUT
        )

    def wait(self, ready: callable) -> None:  # type: ignore[valid-type]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(
                    f"vllm serve exited with {self.process.returncode}:\n{self.tail()}"
                )
            try:
                if ready(self):
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        self.stop()
        pytest.fail(f"vllm serve was not ready in {START_TIMEOUT_S} s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.handle.close()


@contextmanager
def running(
    model: str,
    log: Path,
    env: dict[str, str],
    *args: str,
    ready: Callable[[VllmServer], bool] | None = None,
) -> Iterator[VllmServer]:
    """A ``vllm serve`` of one of the built models, ready (by default: answering a decision), stopped after."""
    instance = VllmServer(model_path(model), log, env, *args)
    try:
        instance.wait(ready or decisions_ready)
        yield instance
    finally:
        instance.stop()


def decisions_ready(server: VllmServer, headers: dict[str, str] | None = None) -> bool:
    """Poll a decision request, not /health: decisions answer 503 until their startup work is done."""
    probe = {
        "model": server.model,
        "input": "x",
        "questions": [{"type": "predicate", "instructions": "x?"}],
    }
    return (
        httpx.post(
            f"{server.url}/v1/decisions", json=probe, headers=headers, timeout=30
        ).status_code
        == 200
    )


def all_workers_ready(server: VllmServer, workers: int = 2) -> bool:
    """Every API-server process (``--api-server-count``) answers decisions (the one calibrating may
    answer on calibration's first pass)."""
    ready = re.findall(
        r"\((ApiServer_\d+) pid=\d+\) INFO .*decisions ready[: ]",
        server.log.read_text(errors="replace"),
    )
    return set(ready) == {f"ApiServer_{i}" for i in range(workers)}


def workers_serving(server: VllmServer, path: str) -> set[str]:
    """The API-server processes whose access log shows a 200 for ``path``."""
    log = server.log.read_text(errors="replace")
    return set(
        re.findall(
            rf"\((ApiServer_\d+) pid=\d+\) INFO: .*\"POST {re.escape(path)} HTTP/1.1\" 200",
            log,
        )
    )


def answered(server: VllmServer, path: str, body: dict) -> dict:
    """POST ``body`` and return the JSON of its answer, which must be a 200."""
    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> VllmServer:
    """SmolLM2-135M-Instruct with decisions on. Strict environment validation proves that every
    VLLM_TYPED_DECISIONS_* variable we read is declared to vLLM. The switch is spelt ``true``, a value that
    once stopped vLLM at startup; test_disabled.py serves with it empty (off)."""
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "true",
        "VLLM_TYPED_DECISIONS_MAX_QUESTIONS": "16",
        "VLLM_TYPED_DECISIONS_MAX_CHOICES": "255",
        "VLLM_TYPED_DECISIONS_MAX_LEVELS": "10",
    }
    log = tmp_path_factory.mktemp("server") / "vllm-serve.log"
    with running(
        "smollm2-135m-instruct", log, env, "--fail-on-environ-validation"
    ) as instance:
        yield instance


@pytest.fixture
def client(server: VllmServer):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        yield http


TINY_QWEN_KEY = "test-key-123"
TINY_QWEN_QUEUE = 4


@pytest.fixture(scope="session")
def tiny_qwen_server(tmp_path_factory) -> VllmServer:
    """A tiny random-weight model with Qwen's real vocabulary, decisions on, behind --api-key. Its
    answers are noise, so the answer-slot self-check is switched off (MIN_OPTION_MASS=0)."""
    log = tmp_path_factory.mktemp("tiny-qwen") / "vllm-serve.log"
    # The example plugin claims Qwen2 models; naming logit here also tests selection by variable.
    # One of the example package's plugins fails to load here (test_faults.py): the server serves on.
    # One read per question (debias off): test_load.py counts reads against the engine's queue.
    env = {
        "VLLM_ENABLE_TYPED_DECISIONS": "1",
        "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit",
        "DECISIONS_TEST_PLUGIN_BROKEN": "1",
        "VLLM_TYPED_DECISIONS_DEBIAS": "off",
    }
    with running(
        "tiny-qwen2-random",
        log,
        env,
        "--api-key",
        TINY_QWEN_KEY,
        # A small engine queue, so test_load.py can fill it; no other test here sends more than 4 reads.
        "--max-num-queued-reqs",
        str(TINY_QWEN_QUEUE),
        # vLLM's request log and load tracking, which the decision routes take part in (test_vllm_handling.py).
        "--enable-log-requests",
        "--enable-server-load-tracking",
        ready=lambda s: decisions_ready(
            s, {"Authorization": f"Bearer {TINY_QWEN_KEY}"}
        ),
    ) as instance:
        yield instance
