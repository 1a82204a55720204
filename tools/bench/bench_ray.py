"""Bulk decisions through Ray Data (tools/examples/ray_decide.py) against ``vllm run-batch``, on the same file and
machine, in one run.

The file is tools/bench/bench_bulk.py's (N lines of 2 questions about one of N/K inputs of ~300 tokens, the
lines shuffled). The same engine arguments for every path (tools/common/serving.py). Phases, one after another:

- run-batch: ``vllm run-batch`` on the file; decisions/s over its answering time (its summary line:
  engine start excluded), and its wall time, start to exit;
- Ray Data, 1 actor: ``python -m tools.examples.ray_decide --actors 1`` on a local cluster it starts, the engine bound
  as run-batch's is (vLLM's ``auto``);
- Ray Data, 2 actors: ``--actors 2``, each engine bound to its own share of the cores (``--bind``), as
  two nodes' engines would each have their own.

For a Ray phase, decisions/s is over the decision stage's own time as Ray Data accounts it
(``Dataset.stats()``: from its first batch handed to a ready actor to its last answered, the actors'
engine starts excluded, as run-batch's summary excludes its engine's), and its wall time, start to exit,
includes starting Ray and the actors. Ray Data's account of where the time went is printed for each.

usage: python -m tools.bench.bench_ray [--model PATH] [--lines N] [--lines-per-input K] [--batch-size B] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench.bench_bulk import ENV, batch, run_batch
from tools.common.serving import DEFAULT_MODEL, cpu_dtype, engine_env

TOOL = "tools.examples.ray_decide"  # run with -m: the child inherits our cwd and environment
QUESTIONS_PER_LINE = 2  # bench_bulk.batch's lines


def engine_flags(dtype: str) -> list[str]:
    """serving.engine_args, as ray_decide.py's --engine-arg."""
    values = {
        "max_model_len": 8192,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "block_size": 32,
        "dtype": dtype,
    }
    return [f"--engine-arg={key}={json.dumps(value)}" for key, value in values.items()]


def core_shares(actors: int) -> list[str]:
    """This machine's cores split evenly among ``actors`` engines, as VLLM_CPU_OMP_THREADS_BIND values."""
    cores = sorted(os.sched_getaffinity(0))
    return [
        ",".join(
            map(str, cores[k * len(cores) // actors : (k + 1) * len(cores) // actors])
        )
        for k in range(actors)
    ]


def ray_phase(
    model: str, source: Path, target: Path, dtype: str, actors: int, batch_size: int
) -> dict[str, Any]:
    bind = [f"--bind={cores}" for cores in core_shares(actors)] if actors > 1 else []
    command = [
        sys.executable,
        "-m",
        TOOL,
        "--model",
        model,
        "-i",
        str(source),
        "-o",
        str(target),
        "--served-model-name",
        "m",
        "--actors",
        str(actors),
        "--batch-size",
        str(batch_size),
        *bind,
        *engine_flags(dtype),
        "--stats",
    ]
    log = target.with_suffix(".log")
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(
            command, env=engine_env(ENV), stdout=out, stderr=subprocess.STDOUT
        ).returncode
    wall = time.monotonic() - started
    text = log.read_text(errors="replace")
    summary = re.search(r"ray_decide: (\d+) lines answered in ([\d.]+) s", text)
    stage = re.search(
        r"MapBatches\(DecisionStage\): (\d+) tasks executed, \d+ blocks produced in ([\d.]+)s",
        text,
    )
    if code != 0 or summary is None or stage is None:
        raise SystemExit(f"ray_decide.py failed ({code}):\n{text[-3000:]}")
    lines, stage_s = int(summary.group(1)), float(stage.group(2))
    answers = [json.loads(line) for line in target.read_text().splitlines()]
    assert all(
        a["response"] and a["response"]["status_code"] == 200 for a in answers
    ), "a line was refused"
    usage = [a["response"]["body"]["usage"] for a in answers]
    tokens = sum(u["input_tokens"] for u in usage)
    cached = sum(u["input_tokens_details"]["cached_tokens"] for u in usage)
    account = text[text.index("Operator 1 MapBatches") :].split("\n\n")[0]
    return {
        "actors": actors,
        "wall_s": wall,
        "stage_s": stage_s,
        "tasks": int(stage.group(1)),
        "decisions_per_s": lines * QUESTIONS_PER_LINE / stage_s,
        "cached_share": cached / max(tokens, 1),
        "input_tokens": tokens,
        "stats": account,
    }


def measure(
    model: str, lines: int, per_input: int, batch_size: int, dtype: str
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        source = folder / "in.jsonl"
        source.write_text(
            "".join(json.dumps(r) + "\n" for r in batch(lines, per_input, phase="red"))
        )
        started = time.monotonic()
        bulk = run_batch(model, source, folder / "run-batch.jsonl", dtype, None)
        bulk["wall_s"] = time.monotonic() - started
        rays = [
            ray_phase(model, source, folder / f"ray-{n}.jsonl", dtype, n, batch_size)
            for n in (1, 2)
        ]
    return {
        "lines": lines,
        "lines_per_input": per_input,
        "batch_size": batch_size,
        "dtype": dtype,
        "run_batch": bulk,
        "ray": rays,
    }


def table(results: dict[str, Any]) -> str:
    bulk = results["run_batch"]
    rows = [
        "| path | decisions/s (answering) | / run-batch | input tokens cached | wall time, start to exit |",
        "|---|---|---|---|---|",
        f"| run-batch | {bulk['decisions_per_s']:.2f} | 1.00x | {bulk['cached_share']:.1%} | {bulk['wall_s']:.0f} s |",
    ]
    for r in results["ray"]:
        rows.append(
            f"| Ray Data, {r['actors']} actor(s) | {r['decisions_per_s']:.2f} | "
            f"{r['decisions_per_s'] / bulk['decisions_per_s']:.2f}x | {r['cached_share']:.1%} | "
            f"{r['wall_s']:.0f} s |"
        )
    one, two = results["ray"]
    rows.append(
        f"| 2 actors / 1 actor | {two['decisions_per_s'] / one['decisions_per_s']:.2f}x | | | |"
    )
    accounts = [
        f"\nRay Data's account, {r['actors']} actor(s):\n{r['stats']}"
        for r in results["ray"]
    ]
    return "\n".join(rows) + "\n" + "\n".join(accounts)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument(
        "--lines-per-input", type=int, default=10, help="lines asking about each input"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="ray_decide.py's lines per actor call",
    )
    parser.add_argument(
        "--dtype", default=cpu_dtype(), help="the engines' dtype (default: %(default)s)"
    )
    parser.add_argument("--json", default="bench-ray-results.json")
    args = parser.parse_args()
    results = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        **measure(
            args.model, args.lines, args.lines_per_input, args.batch_size, args.dtype
        ),
    }
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
