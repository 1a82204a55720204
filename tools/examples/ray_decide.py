"""A ``vllm run-batch`` decision job on a Ray cluster: the same input file, the same output lines.

usage: python -m tools.examples.ray_decide --model MODEL -i IN.jsonl -o OUT.jsonl [--actors N] [--served-model-name NAME]
                                           [--batch-size B] [--address ADDR] [--engine-arg KEY=VALUE ...]
                                           [--bind CORES ...] [--num-cpus C] [--stats]

Reads IN (OpenAI batch lines, as ``vllm run-batch -i``), answers the decision lines with N actors of the
Ray Data stage in bulk/ray_data.py (one engine each, the startup work done once for all of them), and
writes OUT exactly as ``vllm run-batch -o`` does: one output line per input line, a bad line answered in
place, in the order answers arrive. As with run-batch, a rerun with the same OUT skips the lines already
there (batch_file.resume). Lines for vLLM's own endpoints (chat completions, embeddings) are answered
``unsupported_url``: the actors hold an engine, not vLLM's OpenAI servers.

The driver reads IN and writes OUT, so both are local files of the machine it runs on; the lines not
yet answered are held in the driver's memory once (Ray's object store holds them for the actors).
``--address`` joins a running cluster (``ray start --head`` on one node, ``ray start --address`` on the
others); without it a local one is started. ``VLLM_TYPED_DECISIONS_*`` variables set here reach every
actor, and so do the driver's other ``VLLM_``, ``HF_``, ``TORCH_`` and ``OMP_`` variables, but no secret:
a name holding TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL (``HF_TOKEN``, ``VLLM_API_KEY``) is left out, as
Ray shows a runtime_env to anyone who can see the cluster. A worker that needs one (a gated model's
``HF_TOKEN``) reads it from its own node's environment: set it where ``ray start`` runs on each node (Ray's
workers inherit it), or download the model to each node's Hugging Face cache beforehand.

Exit status: 0 when every line is answered 200; 3 when every line is answered but some with an error (a
bad line answered in place: not UTF-8, not JSON, refused, or a fault), the summary saying how many.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ray

from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    TooLong,
    Writer,
    failed,
    invalid_line,
    lines,
    resume,
    too_long,
    unreadable,
)
from vllm.entrypoints.generate.decisions.bulk.ray_data import decisions_stage
from vllm.entrypoints.generate.decisions.bulk.run_batch import FAILED_LINES_EXIT
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.http.wire.handling import new_request_id

# What the actors' engines and decision services read from the driver's environment; never a secret.
FORWARDED = ("VLLM_", "HF_", "TORCH_", "OMP_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")


def forwarded(environ: dict[str, str]) -> dict[str, str]:
    """The variables the actors get: ours and the engine's, without any that names a secret."""
    return {
        name: value
        for name, value in environ.items()
        if name.startswith(FORWARDED)
        and not any(word in name.upper() for word in SECRET_WORDS)
    }


def engine_value(text: str) -> Any:
    """An engine argument's value: JSON when it parses (numbers, true/false), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("-i", "--input-file", required=True, type=Path)
    parser.add_argument("-o", "--output-file", required=True, type=Path)
    parser.add_argument(
        "--actors", type=int, default=1, help="engines, one per actor (default 1)"
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the name the lines' bodies give the model",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="lines per batch handed to an actor (up to 4 batches at once)",
    )
    parser.add_argument(
        "--num-cpus", type=float, default=1, help="CPUs Ray reserves per actor"
    )
    parser.add_argument(
        "--address",
        default=None,
        help="a running Ray cluster's address (default: start one)",
    )
    parser.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="CORES",
        help="VLLM_CPU_OMP_THREADS_BIND of the k-th actor started (repeatable, used in turn)",
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print Ray Data's account of where the time went",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an AsyncEngineArgs field, e.g. dtype=float32 (repeatable)",
    )
    options = parser.parse_args()
    engine_args = {
        key: engine_value(value)
        for key, _, value in (a.partition("=") for a in options.engine_arg)
    }

    done = resume(options.output_file)
    pending, unread = [], []
    # A line over the body limit is answered here without being read whole, as run-batch does.
    limit = Settings.from_env().max_body_bytes
    for number, text in lines(options.input_file, limit):
        if number in done:
            continue
        # A line that isn't UTF-8 is answered here too: Ray's blocks hold only text that is.
        problem = (
            too_long(number, text.size, limit)
            if isinstance(text, TooLong)
            else unreadable(number, text)
        )
        if problem is not None:
            unread.append(invalid_line(number, new_request_id(), problem))
        else:
            pending.append({"line": number, "text": text})
    print(
        f"ray_decide: {len(pending) + len(unread)} lines to answer ({len(done)} already in {options.output_file})",
        flush=True,
    )
    failures = done.failed + len(unread)
    if unread:
        writer = Writer(options.output_file)
        for text in unread:
            writer.write(text)
        writer.close()
    if not pending:
        finish(failures, len(done) + len(unread))
        return
    ray.init(
        address=options.address, runtime_env={"env_vars": forwarded(dict(os.environ))}
    )
    started = time.monotonic()
    stage = decisions_stage(
        options.model,
        engine_args,
        served_model=options.served_model_name,
        concurrency=options.actors,
        batch_size=options.batch_size,
        batch_lines=True,
        num_cpus=options.num_cpus,
        actor_env=[{"VLLM_CPU_OMP_THREADS_BIND": cores} for cores in options.bind],
    )
    writer, written = Writer(options.output_file), 0
    try:
        # One block per batch, so answers come back (and a dead actor's work is redone) a batch at a time.
        dataset = ray.data.from_items(
            pending, override_num_blocks=-(-len(pending) // options.batch_size)
        )
        answered = dataset.map_batches(**stage)
        for batch in answered.iter_batches(batch_format="numpy", batch_size=None):
            for text in batch["text"]:
                writer.write(str(text))
                written += 1
                failures += failed(json.loads(str(text)))
    finally:
        writer.close()
    seconds = time.monotonic() - started
    print(
        f"ray_decide: {written} lines answered in {seconds:.1f} s with {options.actors} actor(s), engine "
        "starts included",
        flush=True,
    )
    if options.stats:
        print(answered.stats(), flush=True)
    finish(failures, len(done) + len(unread) + written)


def finish(failures: int, lines: int) -> None:
    """Exit 3 when some of the output's lines are errors (run-batch's rule), saying how many."""
    if failures:
        print(
            f"ray_decide: {failures} of {lines} lines in the output failed (their error, or a status_code "
            "other than 200, says why)",
            flush=True,
        )
        raise SystemExit(FAILED_LINES_EXIT)


if __name__ == "__main__":
    main()
