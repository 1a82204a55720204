"""Bulk decisions: the same decisions through ``vllm run-batch`` and through the online server at its best
concurrency, in one run.

Builds N batch lines (seeded): each line asks 2 questions about one of N/K inputs of ~300 tokens
(K = --lines-per-input, 10 by default), the lines shuffled, so consecutive lines rarely share an input (a
backlog in arrival order). Each phase's inputs start with their own word, so every phase starts with a
cold prefix cache. Then:

- online: a `vllm serve` (decisions on) answers every line's body, in file order, at 8 and at 32
  requests in flight (--online-in-flight);
  decisions/s, the share of input tokens served from the prefix cache, the server's peak memory;
- bulk: `vllm run-batch` answers the same file; decisions/s over its own answering time (the summary
  line it logs, engine start excluded), the cached share, its peak memory, and its memory over the run
  (the peak in the first and the second half), which a streamed batch keeps flat.

The ratio bulk / best online is the result; this machine is shared and noisy. With --profile DIR, py-spy
samples the server during the online phases and run-batch while it answers (tools/bench/profiling.py) and a
table per path says where the CPU time went.

usage: python -m tools.bench.bench_bulk [--model PATH] [--lines N] [--lines-per-input K] [--profile DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from tools.bench import profiling
from tools.common.serving import (
    DEFAULT_MODEL,
    cpu_dtype,
    engine_args,
    engine_env,
    serve,
    startup_seconds,
    stop,
)

WORDS = [
    "ticket",
    "payout",
    "invoice",
    "refund",
    "account",
    "billing",
    "outage",
    "login",
    "error",
    "delay",
    "customer",
    "order",
    "shipment",
    "contract",
    "renewal",
    "discount",
]
ENV = {"VLLM_TYPED_DECISIONS_CALIBRATION": "off"}
# Each phase's inputs start with its own word, each one token in SmolLM2's tokenizer (and most others), so
# every phase's prompts have the same lengths and the same prefix-cache block boundaries.
PHASES = ("red", "blue", "green", "gold", "gray")


def batch(
    lines: int, per_input: int, seed: int = 0, phase: str = ""
) -> list[dict[str, Any]]:
    """The same lines for every seed; ``phase`` starts each input with its own word, so no phase finds
    another's inputs in the prefix cache (each starts cold, with the same amount of work)."""
    rng = random.Random(seed)
    inputs = [
        f"{phase} " + " ".join(rng.choice(WORDS) for _ in range(220))
        for _ in range(max(1, lines // per_input))
    ]
    records = []
    for i in range(lines):
        body = {
            "model": "m",
            "input": rng.choice(inputs),
            "questions": [
                {
                    "type": "predicate",
                    "instructions": "Is the customer waiting for money?",
                },
                {
                    "type": "choice",
                    "instructions": "Which team?",
                    "choices": [{"value": v} for v in ("billing", "tech", "sales")],
                },
            ],
        }
        records.append(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/decisions",
                "body": body,
            }
        )
    return records


class PeakMemory:
    """The resident memory of a process and its children, sampled every half second."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                tree = [self.process, *self.process.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree if p.is_running())
                self.samples.append((time.monotonic(), rss / 2**30))
            except psutil.Error:
                pass
            time.sleep(0.5)

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.thread.join()
        values = [gib for _, gib in self.samples] or [0.0]
        half = len(values) // 2
        return {
            "peak_gib": max(values),
            "first_half_peak_gib": max(values[:half] or values),
            "second_half_peak_gib": max(values[half:] or values),
        }


async def online(
    url: str, records: list[dict[str, Any]], in_flight: int
) -> dict[str, float]:
    gate = asyncio.Semaphore(in_flight)
    tokens = cached = decisions = 0

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(record: dict[str, Any]) -> None:
            nonlocal tokens, cached, decisions
            async with gate:
                body = (await client.post("/v1/decisions", json=record["body"])).json()
            usage = body["usage"]
            tokens += usage["input_tokens"]
            cached += usage["input_tokens_details"]["cached_tokens"]
            decisions += sum(a["type"] != "refusal" for a in body["answers"])

        started = time.monotonic()
        await asyncio.gather(*(one(r) for r in records))
        seconds = time.monotonic() - started
    return {
        "in_flight": in_flight,
        "decisions_per_s": decisions / seconds,
        "decisions": decisions,
        "cached_share": cached / max(tokens, 1),
        "input_tokens": tokens,
    }


def run_batch(
    model: str, source: Path, target: Path, dtype: str, profile: Path | None
) -> dict[str, Any]:
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "run-batch",
        "-i",
        str(source),
        "-o",
        str(target),
        "--model",
        model,
        *engine_args(dtype),
        *os.environ.get("BULK_ENGINE_ARGS", "").split(),
    ]
    log = target.with_suffix(".log")
    process = subprocess.Popen(
        command, env=engine_env(ENV), stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    memory = PeakMemory(process.pid)
    sampler = None
    # from the batch's start (its output file opens) on: engine start-up isn't batch work
    if profile is not None:
        while process.poll() is None and not target.exists():
            time.sleep(0.2)
        sampler = profiling.Profile(process.pid, profile)
    if process.wait() != 0:
        raise SystemExit(f"run-batch failed:\n{log.read_text()[-3000:]}")
    if sampler is not None:
        sampler.stop()
    summary = re.search(
        r"decision batch: (\d+) lines in ([\d.]+) s .*?(\d+) decisions, [\d.]+ decisions/s"
        r"(?:, ([\d.]+)% of (\d+) input tokens cached)?",
        log.read_text(),
    )
    if summary is None:
        raise SystemExit(f"run-batch logged no summary:\n{log.read_text()[-3000:]}")
    seconds, decisions = float(summary.group(2)), int(summary.group(3))
    return {
        "decisions_per_s": decisions / seconds,
        "answering_s": seconds,
        "decisions": decisions,
        "cached_share": float(summary.group(4) or 0) / 100,
        "input_tokens": int(summary.group(5) or 0),
        **memory.stop(),
    }


def measure(
    model: str,
    lines: int,
    dtype: str | None = None,
    per_input: int = 10,
    profile: Path | None = None,
    online_in_flight: tuple[int, ...] = (8, 32),
) -> dict[str, Any]:
    dtype = dtype or cpu_dtype()
    profiles = {}
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        port, url = 8191, "http://127.0.0.1:8191"
        process = serve(model, port, str(folder), folder / "serve.log", ENV, dtype)
        try:
            startup_seconds(url, process)
            memory = PeakMemory(process.pid)
            sampler = (
                profiling.Profile(process.pid, profile / "online.txt")
                if profile
                else None
            )
            runs = [
                asyncio.run(online(url, batch(lines, per_input, phase=PHASES[i]), n))
                for i, n in enumerate(online_in_flight)
            ]
            if sampler is not None:
                profiles["online"] = profiling.summarize(
                    sampler.stop(), per=sum(r["decisions"] for r in runs)
                )
            server_memory = memory.stop()
        finally:
            stop(process)
        source = folder / "in.jsonl"
        source.write_text(
            "".join(
                json.dumps(r) + "\n" for r in batch(lines, per_input, phase=PHASES[-1])
            )
        )
        bulk = run_batch(
            model, source, folder / "out.jsonl", dtype, profile and profile / "bulk.txt"
        )
        if profile is not None:
            profiles["bulk"] = profiling.summarize(
                profile / "bulk.txt", per=bulk["decisions"]
            )
    best = max(runs, key=lambda r: r["decisions_per_s"])
    return {
        "lines": lines,
        "lines_per_input": per_input,
        "dtype": dtype,
        "online": runs,
        "online_peak_gib": server_memory["peak_gib"],
        "bulk": bulk,
        "ratio": bulk["decisions_per_s"] / best["decisions_per_s"],
        "profiles": profiles,
    }


def table(results: dict[str, Any]) -> str:
    b = results["bulk"]
    rows = [
        "| path | decisions/s | cached share of input tokens | peak memory (GiB) |",
        "|---|---|---|---|",
    ]
    for r in results["online"]:
        rows.append(
            f"| online, {r['in_flight']} in flight | {r['decisions_per_s']:.1f} | {r['cached_share']:.1%} | "
            f"{results['online_peak_gib']:.2f} (server) |"
        )
    rows.append(
        f"| run-batch ({results['lines']} lines) | {b['decisions_per_s']:.1f} | {b['cached_share']:.1%} | "
        f"{b['peak_gib']:.2f} (first half {b['first_half_peak_gib']:.2f}, second half "
        f"{b['second_half_peak_gib']:.2f}) |"
    )
    rows.append(f"| run-batch / best online | {results['ratio']:.2f}x | | |")
    tokens = {r["input_tokens"] for r in [*results["online"], b]}
    if len(tokens) > 1:
        rows.append(
            f"(the phases' prompts differ in length: {sorted(tokens)} input tokens; not the same work)"
        )
    for path, summary in results.get("profiles", {}).items():
        rows += ["", profiling.table(f"{path} (py-spy)", summary, "decision")]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument(
        "--lines-per-input", type=int, default=10, help="lines asking about each input"
    )
    parser.add_argument(
        "--dtype",
        default=cpu_dtype(),
        help="the engines' --dtype (default: %(default)s)",
    )
    parser.add_argument(
        "--online-in-flight",
        default="8,32",
        help="the online concurrencies, comma-separated",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="write py-spy samples here and print where the time went",
    )
    parser.add_argument("--json", default="bench-bulk-results.json")
    args = parser.parse_args()
    online_in_flight = tuple(int(n) for n in args.online_in_flight.split(","))
    # each phase needs a word of its own, or it starts with a warm cache
    if len(online_in_flight) >= len(PHASES):
        parser.error(f"--online-in-flight: at most {len(PHASES) - 1} concurrencies")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    results = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        **measure(
            args.model,
            args.lines,
            args.dtype,
            args.lines_per_input,
            args.profile,
            online_in_flight,
        ),
    }
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
