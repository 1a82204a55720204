"""vLLM's multi-node data parallelism with decisions on, as docs/bulk.md (Scale-out) gives it, on one
machine as two "nodes" over the loopback address: node 0 (``vllm serve``, or ``vllm run-batch``) holds
replica 0 and the front end, node 1 is a headless ``vllm serve`` holding replica 1. The reads about one
input go to the replica its hash names (test_scale_out.py), here across the two nodes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..conftest import model_path
from .conftest import VllmServer, answered, decisions_ready, free_port, running
from .test_scale_out import TINY_ENV, successes

# Several engines at once (tools/test.sh runs these files in a pass of their own: beside the other tests'
# servers a 24 GiB machine ran out of memory).
pytestmark = pytest.mark.many_engines
MODEL = "tiny-qwen2-random"


def data_parallel(rpc_port: int) -> tuple[str, ...]:
    """The flags both nodes share: two replicas, one on each node, node 0's address and RPC port."""
    return (
        "--data-parallel-size",
        "2",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(rpc_port),
    )


def node_bindings() -> tuple[dict[str, str], dict[str, str]]:
    """VLLM_CPU_OMP_THREADS_BIND for node 0 and node 1. Each node has one local replica, so one core list
    each (vLLM takes the list at the local rank, 0 on both). Left at ``auto``, both would bind the same
    core on a small machine (tests/conftest.py); here each takes half of the cores. Under pytest-xdist
    both nodes share this worker's cores, as the replicas of test_scale_out.py do."""
    cores = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if cores == "nobind":
        return {}, {}
    if cores != "auto":
        return {"VLLM_CPU_OMP_THREADS_BIND": cores}, {
            "VLLM_CPU_OMP_THREADS_BIND": cores
        }
    mine = sorted(os.sched_getaffinity(0))
    half = max(1, len(mine) // 2)
    first, second = mine[:half], mine[half:] or mine
    return (
        {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, first))},
        {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, second))},
    )


@contextmanager
def headless_node(log: Path, rpc_port: int) -> Iterator[VllmServer]:
    """Node 1: ``vllm serve --headless`` with replica 1, no API server. Decisions are answered by node 0's
    front end, so node 1 runs without the decision settings (VllmServer drops the VLLM_*TYPED* variables
    of this environment). It does not exit when node 0 does, so it is stopped here, by its PID."""
    node = VllmServer(
        model_path(MODEL),
        log,
        node_bindings()[1],
        "--headless",
        *data_parallel(rpc_port),
        "--data-parallel-start-rank",
        "1",
    )
    try:
        yield node
    finally:
        node.stop()


def alive(node: VllmServer) -> None:
    if node.process.poll() is not None:
        pytest.fail(
            f"the headless node exited with {node.process.returncode}:\n{node.tail()}"
        )


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[VllmServer]:
    """Node 0's ``vllm serve``, ready once both replicas are up (it waits for node 1's handshake)."""
    folder = tmp_path_factory.mktemp("multinode")
    rpc_port = free_port()
    with headless_node(folder / "node1.log", rpc_port) as node1:
        # One API-server process in front of both replicas (vLLM would start one per replica).
        args = (*data_parallel(rpc_port), "--api-server-count", "1")

        def ready(server: VllmServer) -> bool:
            alive(node1)
            return decisions_ready(server)

        with running(
            MODEL,
            folder / "node0.log",
            {**TINY_ENV, **node_bindings()[0]},
            *args,
            ready=ready,
        ) as node0:
            yield node0
        alive(node1)  # still up: it served to the end


def replica(state: str) -> str:
    """The replica the reads about ``state`` go to (affinity.py)."""
    return str(int(hashlib.sha256(state.encode()).hexdigest()[:12], 16) % 2)


def grown(server: VllmServer, before: dict[str, float]) -> dict[str, float]:
    """Finished engine requests per replica since ``before``, once the metrics show any."""
    deadline = time.monotonic() + 10
    while (after := successes(server)) == before and time.monotonic() < deadline:
        time.sleep(0.2)  # the metrics follow the responses
    return {
        engine: after[engine] - before.get(engine, 0.0)
        for engine in after
        if after[engine] > before.get(engine, 0.0)
    }


def test_both_wires_are_answered_by_both_nodes(two_nodes):
    seen = set()
    for i in range(6):
        state = (
            f"Ticket {i}: the payout to account {i} is late, "
            + "and the customer wrote again. " * 10
        )
        if i % 2:
            path, body = (
                "/v1/decisions",
                {
                    "model": "m",
                    "input": state,
                    "questions": [
                        {"type": "predicate", "instructions": "Is it urgent?"},
                        {
                            "type": "choice",
                            "instructions": "Which team?",
                            "choices": [{"value": "billing"}, {"value": "tech"}],
                        },
                    ],
                },
            )
        else:
            path, body = (
                "/v1/systemone",
                {
                    "state": state,
                    "questions": {
                        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
                        "team": {
                            "type": "choice",
                            "instructions": "Which team?",
                            "criteria": {"billing": None, "tech": None},
                        },
                    },
                },
            )
        before = successes(two_nodes)
        answers = answered(two_nodes, path, body)["answers"]
        assert len(answers) == 2
        # Two questions, one reading each (rotate:1), all on the replica the input's hash names.
        assert grown(two_nodes, before) == {replica(state): 2.0}
        seen.add(replica(state))
    assert seen == {"0", "1"}  # both nodes served reads


def test_run_batch_as_node_0(tmp_path):
    """``vllm run-batch`` as node 0 against its own headless node 1 (a headless node serves the one
    front end it first shook hands with): every line answered, lines about both replicas' inputs."""
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    states = [
        f"Ticket {i % 8}: the payout to account {i % 8} is late." for i in range(16)
    ]
    lines = []
    for i, state in enumerate(states):
        if i % 2:
            url, body = (
                "/v1/decisions",
                {
                    "model": "m",
                    "input": state,
                    "questions": [
                        {
                            "type": "predicate",
                            "instructions": f"Is point {i % 3} urgent?",
                        }
                    ],
                },
            )
        else:
            url, body = (
                "/v1/systemone",
                {
                    "state": state,
                    "questions": {"u": {"type": "noul", "instructions": "Urgent?"}},
                },
            )
        lines.append(
            json.dumps(
                {"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body}
            )
        )
    source.write_text("\n".join(lines) + "\n")
    # The reads of an input hashing to replica 1 are sent to that rank (vllm_host.py, data_parallel_rank), which
    # only node 1 holds: with inputs of both kinds, every line answered means both nodes served.
    assert {replica(state) for state in states} == {"0", "1"}
    rpc_port = free_port()
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "run-batch",
        "-i",
        str(source),
        "-o",
        str(target),
        "--model",
        str(model_path(MODEL)),
        "--served-model-name",
        "m",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--block-size",
        "32",
        "--max-model-len",
        "2048",
        "--enable-prefix-caching",
        *data_parallel(rpc_port),
    ]
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VLLM_TYPED", "VLLM_ENABLE_TYPED"))
        },
        "HF_HUB_OFFLINE": "1",
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        **TINY_ENV,
        **node_bindings()[0],
    }
    log = tmp_path / "node0.log"
    with headless_node(tmp_path / "node1.log", rpc_port) as node1, log.open("w") as out:
        # Its own process group, so a stop reaches its engine and coordinator processes too.
        batch = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 600
            while batch.poll() is None:
                alive(node1)
                assert time.monotonic() < deadline, log.read_text(errors="replace")[
                    -3000:
                ]
                time.sleep(1)
        finally:
            if batch.poll() is None:
                os.killpg(batch.pid, 9)
                batch.wait()
    assert batch.returncode == 0, log.read_text(errors="replace")[-3000:]
    written = [json.loads(line) for line in target.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in written) == sorted(
        f"line-{i}" for i in range(len(states))
    )
    assert all(r["response"]["status_code"] == 200 for r in written), written
