"""How often the decisions are right, and how well their probabilities are calibrated, against the
alternatives a user would use instead: side by side in one run against one real server.

Starts its own `vllm serve` (decisions on, startup calibration on the bundled set, in a fresh
calibration folder unless --calibration-dir names one a rerun can reuse) unless --port targets a
running one, and waits until decisions answer (503 until the calibration is done). Over a labelled
file in the calibration format it asks every question once per row, one question per request.

Rows (--rows picks some, by name; without it every row but ``reasoning``, which costs tens of times
the others, and ``upstream``, which needs --upstream-port):

- ``off``, ``content-free``, ``fitted``, ``content-free+fitted``: ours on /v1/systemone with letter
  labels (``extra.backend_options.labels`` ``letters``), ``extra.prior`` set to that read correction
  and ``extra.debias`` ``rotate:1`` (one reading);
- ``words``, ``words+content-free``, ``words+fitted``: the same with the words layout (``labels``
  ``words``: Yes/No, level digits, a choice's own values where each is one token);
- ``default``: ours with neither ``prior``, ``debias`` nor ``labels`` (whatever the server does by
  default: calibration's choice of layout and correction per question type);
- ``rotate``: ours with letters, ``prior`` ``off`` and ``debias`` ``rotate`` (two readings: the old
  default).
  A server that refuses a row's ``extra`` (400 or 422, e.g. one without ``prior``) makes that row
  unavailable; the reason is printed and the other rows go on.
  An answer's scores are ``extra.audit.prior.adjusted_logits`` when a correction applied, else
  ``extra.backend.option_logits``, plus T times the bias of its question's own map where the
  operator's labels gave it one (``extra.audit.question_map``, or ``examples``); its T is
  ``extra.audit.calibration_temperature``. Raw probabilities are softmax(scores), calibrated (the
  served ones) softmax(scores / T).
- ``batch``: batch calibration, computed here from the ``off`` row's answers (what a bulk run over
  the whole file could do): each answer's log-softmax scores minus the mean log-softmax over all the
  answers to the same question (the same question JSON) in the file (log-probabilities floored at
  -100 before the mean), then softmax, and softmax of that over the answer's own T. A question asked
  once is left with no preference (uniform), so this row means something only where each question
  is asked about many inputs. Its cost is the ``off`` row's: the same requests, plus arithmetic, but
  nothing can be answered before the whole file is.
- ``generation``: vLLM's own POST /v1/chat/completions on the same server and model: the input, the
  question and its options with their descriptions in plain words as one user turn ending "Answer
  with one of: k1, k2, ...", the reply restricted to the option keys (``structured_outputs.choice``),
  temperature 0, logprobs with top_logprobs 20. The keys are the choice values, ``yes``/``no``, and
  for a score the level numbers 0, 1, ... (the prompt lists each with its label, lowest first).
  Generation gives no distribution: the answer is the generated key, its probability exp of the sum
  of the generated tokens' logprobs (the key's tokens and the end of text the grammar allows after
  it), and the remaining mass (at least 1e-6, so a certain wrong answer has a finite log loss) is
  shared equally by the other options. No T: calibrated = raw.
- ``reasoning``: chain of thought on the same server and model, what a user would try when one token
  is not enough: ``generation``'s chat with its last line asking for two or three sentences of
  reasoning, quoting the input, and then a line ``Answer: <key>``; the reasoning is generated freely
  (temperature 0, at most 256 tokens, stopped at ``Answer:``), then the chat is continued after it
  and ``Answer:`` (``continue_final_message``) with the reply restricted to the keys, each after a
  space, and scored as ``generation`` scores its reply. Two requests a question; no T.
- ``letters``: the letter-logprob read a user builds on vLLM without our overlay, on the same server:
  the user renders the prompt themselves with the model folder's chat template (--model;
  add_generation_prompt), a system turn and one user turn holding the document, the question and its
  options lettered in option order (``A. key: meaning``, the keys and meanings of ``generation``), and
  ``Answer with one letter (A-..).``; POST /v1/completions with ``max_tokens`` 1, ``temperature`` 0 and
  ``logprobs`` 20 (vLLM's default --max-logprobs, the most a server returns unless raised). An option's
  score is the log of the summed probabilities of its letter with and without a leading space among
  the first token's top 20; a letter absent from them gets the mass the top 20 leave, shared by the
  absent letters, at most the least shown token's probability, at least 1e-6 (as ``generation``).
  No T: calibrated = raw; its probabilities are those scores' softmax over the options.
- ``upstream`` (with --upstream-port N): upstream vLLM 0.32's own POST /v1/systemone on a server
  already running there, with its request shape (``model``, ``state``, ``questions`` of ``type``,
  ``instructions``, ``criteria``) and its answers' ``probabilities`` (keyed by choice name, ``yes``/
  ``no``, ``"0"``...; at most 26 choices and 10 levels, a bigger question is a failed answer). No T:
  calibrated = raw. Its time is another server's, on whatever machine that one runs.

Metrics per row, per question type and overall (``all``), over the answered questions:

- ``n``, ``accuracy`` (the served probabilities' top option, the first on a tie);
- ``confidence``: the served top probability, averaged: under ``accuracy``, the answers are
  underconfident; over it, overconfident;
- ``majority``: the share a predictor would get right that answers every question (same question
  JSON) with the correct option most common among that question's answers here: the sum over distinct
  questions of that option's count, over n. It has seen the labels, so it is a bar to clear, not a
  fair competitor; a question asked once gets it right by construction;
- ``mean acc/q``: accuracy per distinct question, averaged over the distinct questions;
- ``log loss`` and ``Brier`` of the served probabilities (both raw ones too in --json);
- ECE of the raw and of the calibrated probabilities (10 bins) with its 95% group-bootstrap interval
  (the file's groups), by the server's own calibration maths;
- ``top share``: for each distinct question asked at least twice, the share of its answers that
  went to its most-picked option, averaged over those questions; ``collapsed``: how many of them had
  one option take more than 80% of their answers while being right less than half the time;
- ``abstains`` and ``precision``, where the server answers ``extra.abstention`` (an operator's
  VLLM_TYPED_DECISIONS_PRECISION, or a ``precision`` in its calibration file): the share of answers
  that abstained, and the accuracy of the others;
- seconds per decision, and the ratio to the first row: per question, the rows run one after another
  in a shuffled order, the questions in a shuffled order, --concurrency questions in flight, so each
  row meets the same load and prefix cache; a row's time is the sum of its own requests' times.

usage: python -m tools.quality.accuracy [--model PATH] [--port N [--api-key KEY]] [--questions FILE] [--limit N] [--rows A,B]
                                        [--concurrency N] [--json OUT] [--seed N] [--upstream-port N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tools.common.serving import (
    add_key_argument,
    add_server_arguments,
    key_headers,
    served_model,
    target,
    wait_ready,
)
from tools.quality.accuracy_figures import (
    Reading,
    batch_calibrated,
    first_errors,
    row_metrics,
    table,
)
from tools.quality.accuracy_rows import ROWS, RowRefused, Servers
from vllm.entrypoints.generate.decisions.calibration import question_file

DEFAULT_QUESTIONS = str(Path(__file__).parent / "data" / "heldout.jsonl")


# --- questions --------------------------------------------------------------------------------


def load_items(path: str, limit: int | None) -> list[question_file.LabelledQuestion]:
    """The file's questions; with ``limit``, those about its first ``limit`` distinct inputs."""
    items = list(question_file.load(path).questions)
    if not limit:
        return items
    states = list(dict.fromkeys(item.state for item in items))[:limit]
    chosen = set(states)
    return [item for item in items if item.state in chosen]


# --- running ----------------------------------------------------------------------------------


# A question every row can ask, to find the rows a server refuses whatever the question.
PROBE = {
    "state": "Ticket: my card was charged twice.",
    "question": {"type": "noul", "instructions": "Is it urgent?"},
    "expected": "no",
}
# What a reading can fail with besides a refusal: an answer not in the shape expected.
SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError)


async def refusals(servers: Servers, rows: Sequence[str]) -> dict[str, str]:
    """The rows whose requests the server refuses outright (400 or 422 on a plain yes/no), and why."""
    probe = question_file.parse_line(0, json.dumps(PROBE))
    unavailable = {}
    for row in rows:
        try:
            await servers.ask(row, probe)
        except RowRefused as refused:
            if refused.status in (400, 422):
                unavailable[row] = str(refused)
        except SHAPE_ERRORS as exc:
            unavailable[row] = (
                f"an answer in another shape ({type(exc).__name__}: {exc})"
            )
    return unavailable


async def run_rows(
    servers: Servers,
    items: list[question_file.LabelledQuestion],
    rows: Sequence[str],
    concurrency: int,
    seed: int,
) -> dict[str, list[Reading]]:
    """Every question under every row, timed; rows interleaved per question in a shuffled order."""
    gate = asyncio.Semaphore(concurrency)
    readings: dict[str, list[Reading]] = {
        row: [Reading([], error="not asked")] * len(items) for row in rows
    }
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)

    async def one(index: int) -> None:
        names = list(rows)
        random.Random(f"{seed}-{index}").shuffle(names)
        async with gate:
            for row in names:
                started = time.perf_counter()
                try:
                    reading = await servers.ask(row, items[index])
                except RowRefused as refused:
                    reading = Reading([], error=str(refused))
                except SHAPE_ERRORS as exc:
                    reading = Reading([], error=f"{type(exc).__name__}: {exc}")
                reading.seconds = time.perf_counter() - started
                readings[row][index] = reading

    await asyncio.gather(*(one(i) for i in order))
    return readings


# --- main -------------------------------------------------------------------------------------


def add_started_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The server options: a running one (--port) or one started here with calibration on."""
    add_server_arguments(parser, "nothing (not used here)")
    parser.add_argument(
        "--serve-port",
        type=int,
        default=8024,
        help="the started server's port (%(default)s)",
    )
    parser.add_argument(
        "--calibration-dir",
        help="the started server's calibration folder, kept for a rerun",
    )
    add_key_argument(parser)


def calibrated_env(args: argparse.Namespace) -> dict[str, str]:
    """The started server's environment: startup calibration on the bundled set, in
    --calibration-dir when given (a rerun reuses its record), with no first pass: every answer
    measured is on the full calibration, none on a first pass still being replaced."""
    env = {
        "VLLM_TYPED_DECISIONS_CALIBRATION": "on",
        "VLLM_TYPED_DECISIONS_FIRST_PASS": "off",
    }
    if args.calibration_dir:
        Path(args.calibration_dir).mkdir(parents=True, exist_ok=True)
        env["VLLM_TYPED_DECISIONS_CALIBRATION_DIR"] = str(
            Path(args.calibration_dir).resolve()
        )
    return env


def chosen_rows(args: argparse.Namespace) -> list[str]:
    rows = (
        args.rows.split(",")
        if args.rows
        else [
            r
            for r in ROWS
            if r != "reasoning" and (r != "upstream" or args.upstream_port)
        ]
    )
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; the rows: {', '.join(ROWS)}")
    if "upstream" in rows and not args.upstream_port:
        raise SystemExit("the upstream row needs --upstream-port")
    return rows


async def measure(
    url: str, args: argparse.Namespace, items: list[question_file.LabelledQuestion]
) -> dict[str, Any]:
    rows = chosen_rows(args)
    # The batch row is computed from the off row's answers.
    asked = [r for r in ROWS if r in rows and r != "batch"] + (
        ["off"] if "batch" in rows and "off" not in rows else []
    )
    headers = key_headers(args.api_key)
    await wait_ready(url, headers=headers)
    upstream_url = (
        f"http://127.0.0.1:{args.upstream_port}" if args.upstream_port else None
    )
    async with (
        httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as ours,
        httpx.AsyncClient(base_url=upstream_url or url, timeout=600) as upstream,
    ):
        servers = Servers(ours, await served_model(ours), args.model)
        if upstream_url:
            servers.upstream, servers.upstream_model = (
                upstream,
                await served_model(upstream),
            )
        unavailable = await refusals(servers, asked)
        print(
            f"asking {len(items)} questions under {', '.join(r for r in asked if r not in unavailable)}",
            file=sys.stderr,
        )
        readings = await run_rows(
            servers,
            items,
            [r for r in asked if r not in unavailable],
            args.concurrency,
            args.seed,
        )
    if "batch" in rows:
        if "off" in readings:
            readings["batch"] = batch_calibrated(items, readings["off"])
        else:
            unavailable["batch"] = (
                f"computed from the off row, which is unavailable ({unavailable['off']})"
            )
    results: dict[str, Any] = {"rows": {}}
    for row in rows:
        if row in unavailable:
            results["rows"][row] = {"unavailable": unavailable[row]}
        else:
            results["rows"][row] = {
                "metrics": row_metrics(items, readings[row], args.seed),
                "errors": first_errors(readings[row]),
            }
    return results


def report(command: str, text: str, results: dict[str, Any], path: str | None) -> None:
    """The command and the table on stdout; every figure to ``path`` when given."""
    print(f"`{command}`\n")
    print(text)
    if path:
        Path(path).write_text(json.dumps(results, indent=2) + "\n")
        print(f"(wrote {path})", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_started_server_arguments(parser)
    parser.add_argument(
        "--questions",
        default=DEFAULT_QUESTIONS,
        help="a labelled file (calibration format)",
    )
    parser.add_argument(
        "--limit", type=int, help="only the questions about the file's first N inputs"
    )
    parser.add_argument(
        "--rows", help="a comma-separated subset of: " + ", ".join(ROWS)
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="questions in flight"
    )
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="question and row order, bootstrap resamples",
    )
    parser.add_argument(
        "--upstream-port",
        type=int,
        help="an upstream vLLM 0.32 server for the upstream row",
    )
    args = parser.parse_args()
    chosen_rows(args)
    command = shlex.join([sys.executable, *sys.argv])
    try:
        items = load_items(args.questions, args.limit)
    except question_file.QuestionFileError as exc:
        raise SystemExit(f"accuracy.py: {exc}") from None
    started = time.perf_counter()
    with target(args, args.serve_port, calibrated_env(args)) as (url, _):
        results = asyncio.run(measure(url, args, items))
    results.update(
        command=command,
        model=args.model,
        questions=args.questions,
        limit=args.limit,
        date=time.strftime("%Y-%m-%d"),
        seconds=round(time.perf_counter() - started),
    )
    report(command, table(results), results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
