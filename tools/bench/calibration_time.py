"""How long a fresh server takes to answer, and to finish its full calibration, against a plain read.

Starts `vllm serve` on the model with decisions on and a fresh calibration folder, then prints the
seconds from /health to the first answered decision (and what its audit says it was calibrated on),
from /health to the full calibration in force (its saved record, then an answer whose audit says
``full``), the engine reads each took, and both in units of a plain one-token read of a
calibration-sized prompt on the same server (bench.py's calibration cost), so the figures travel
between machines. ``--no-first-pass`` serves with VLLM_TYPED_DECISIONS_FIRST_PASS=off, for the
before-and-after.

usage: python -m tools.bench.calibration_time [--model PATH] [--no-first-pass] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tools.bench.bench import calibration_cost, saved_calibration, startup_reads
from tools.common.serving import add_server_arguments, serve, startup_seconds, stop

PROBE = {
    "model": "m",
    "input": "My payouts have been failing for 3 days.",
    "questions": [{"type": "predicate", "instructions": "Is it urgent?"}],
}


def audit(url: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/decisions", json=PROBE, timeout=60)
    response.raise_for_status()
    return response.json()["answers"][0]["extra"]["audit"]


def measure(model: str, dtype: str, first_pass: bool) -> dict[str, Any]:
    port = 8191
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as calibration_dir:
        env = {"VLLM_TYPED_DECISIONS_FIRST_PASS": "on" if first_pass else "off"}
        log = Path(calibration_dir) / "serve.log"
        process = serve(model, port, calibration_dir, log, env, dtype=dtype)
        try:
            first_s = startup_seconds(url, process)
            health_at = time.perf_counter() - first_s
            first = audit(url)
            first_reads = startup_reads(url)
            saved_calibration(calibration_dir)  # the full calibration's record
            full_s = time.perf_counter() - health_at
            cost = asyncio.run(calibration_cost(url, "m", model, calibration_dir))
            cost["startup_engine_reads"] = first_reads
            # The record is saved a moment before the service swaps: an answer says which is in force.
            full = audit(url)
        finally:
            stop(process)
    plain = cost.get("plain_read_p50_s")
    return {
        "first_pass": first_pass,
        "first_answer_s": first_s,
        "first_answer_stage": first.get("calibration_stage"),
        "first_answer_question_reads": first.get("calibration_reads"),
        "full_in_force_s": full_s,
        "full_question_reads": full.get("calibration_reads"),
        "first_answer_in_plain_reads": first_s / plain if plain else None,
        **cost,
    }


def table(r: dict[str, Any]) -> str:
    plain = r.get("plain_read_p50_s")
    lines = [
        f"first pass {'on' if r['first_pass'] else 'off'}; a plain read p50 "
        + (f"{plain * 1000:.0f} ms" if plain else "unknown"),
        f"| /health to the first answer | {r['first_answer_s']:.0f} s | "
        f"{r['startup_engine_reads']} engine reads | {r['first_answer_stage']} "
        f"({r['first_answer_question_reads']} question reads) | "
        + (f"{r['first_answer_in_plain_reads']:.0f} plain reads |" if plain else "|"),
    ]
    if "calibration_s" in r:
        lines.append(
            f"| /health to the full calibration in force | about {r['full_in_force_s']:.0f} s "
            f"(its record: {r['calibration_s']:.0f} s) | {r['calibration_engine_reads']} engine reads | "
            f"full ({r['full_question_reads']} question reads) | {r['in_plain_reads']:.0f} plain reads |"
        )
    else:
        lines.append(f"| the full calibration | {r.get('failed')} | | | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_arguments(parser, "unused")
    parser.add_argument("--no-first-pass", action="store_true")
    parser.add_argument("--json", default="calibration_time.json")
    args = parser.parse_args()
    result = measure(args.model, args.dtype, not args.no_first_pass)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
