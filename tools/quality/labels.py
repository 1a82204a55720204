"""What an operator's labels buy, measured on inputs the server never saw.

An operator has labelled answers of its own questions (``--labels``: the calibration file format,
the same questions as the held-out set about other inputs, one group per input). This asks one
server every line of the labels file and of the held-out set once (``/v1/systemone``, ``extra.detail``
``full``, nothing else in ``extra``: the server's default reads) and keeps each answer's corrected
scores (the audit's ``prior.adjusted_logits`` where a correction applied, else
``backend.option_logits``, in option order) and its type's T (``calibration_temperature``); and, for
the batch calibration row, each held-out line once more with no correction (accuracy.py's ``off``
row); and every line of both files as a user's letter read on ``/v1/completions`` (accuracy.py's
``letters`` row, rendered with the chat template of the ``--model`` folder). The reads are cached in
``--reads FILE`` (per row, keyed by each line's input and question, reused when present, so the
offline part reruns without a server, and a grown labels file or a cache from before the letter rows
asks only what it lacks; a cache read with another ``--model`` is refused).

Then, offline, ``--splits`` seeded draws: each gives the server ``--labels-per-question K`` labelled
inputs per question (whole groups, drawn at random) and evaluates on every held-out line, which is
never fitted on. Rows, per type and per question, mean ± sample standard deviation over splits:

- ``no labels``: the answers as the server gives them (softmax(scores / T));
- ``labels -> per-question map``: per question, ``choose_question_map`` fitted on the drawn labels'
  scores with scale 1/T, as the server fits an operator's file (no map for a question with fewer than
  8 drawn labels, MIN_LABELS, as the server); a held-out answer is served by the map where the keep
  rule kept it, else as in ``no labels``;
- ``labels -> type T`` and ``labels -> type T + per-question map``: the labels as the server's
  calibration file: each type's T refitted on the drawn labels by the server's own rules
  (``calibrate``, ``type_fits``; T = 1 where none is kept), then the two rows above at those T;
- ``batch calibration``: accuracy.py's batch row on the held-out lines' uncorrected reads (each answer's
  log-softmax minus the mean over the held-out answers to its question): needs the whole batch first
  and no labels, so it does not vary with the split;
- ``letter logprobs``: the read a user builds on vLLM without our overlay (accuracy.py's ``letters``
  row: their own chat template render, one token from /v1/completions, the option letters' top-20
  log-probabilities), every line of both files read once more that way, served as read
  (softmax(scores), T = 1);
- ``letter logprobs -> per-question map``: the map row's fitting on the letter reads of the drawn labels
  (scale 1: the letter reads have no T); abstention as for the map row: what labels buy a user's own
  read.
- ``labels -> examples + map`` and ``examples + map, always`` (with ``--examples N``;
  labels_examples.py): per question, the drawn labels read again with examples from the other folds,
  measured against their plain reads (``calibration/examples.measure``, the server's own code), then
  the held-out lines read with the examples the server would serve; the first row serves those reads
  (under the examples' map) where the keep rule kept them, else as the map row (the issue's "both":
  per-question map and examples, each where kept; examples never go without their map, so there is no
  examples-only row); the second for every measured question. These reads need the engine per split: started in process (calibration off) with
  the layouts and corrections of ``--saved-calibration`` (the record the cached plain reads were served
  under), cached in ``--reads`` by line and examples; ``--examples-questions N`` limits them to N
  questions taken in turn per type. Abstention as for the map row: each drawn label served as the row
  would serve it from the other folds (its read with examples from the other folds, which ``measure``
  asks anyway, under the examples and map measured on the other folds).

Figures, on the held-out lines: accuracy (the served top option), mean confidence (the served top
probability), the majority answer (each held-out question's most common answer; a bar, it has seen
the labels), mean accuracy per question, log loss, calibrated ECE (10 bins) and its floor (the mean
ECE a perfectly calibrated model with the same confidences shows on as many answers:
accuracy_figures.ece_floor), collapsed questions (accuracy.py's rule: one option takes over 80% of a
question's answers while it is right less than half the time), ``one answer`` (questions whose every
held-out input got the same answer), maps kept, and abstention at ``--precision P``: per type, the
threshold ``fit_abstention`` finds on the drawn labels' held-out confidences (for the map row,
cross-validated: each label served by maps fitted on the other folds of its question's labels,
groups within a fold; for ``no labels``, the type's softmax, which never saw the labels), then the
share of held-out answers below it (abstains) and the accuracy of the rest (precision).

usage: python -m tools.quality.labels [--model PATH] [--port N] [--labels FILE] [--heldout FILE]
                                      [--reads FILE] [--splits N] [--labels-per-question K]
                                      [--precision P] [--json OUT] [--seed N]
                                      [--examples N --saved-calibration FILE]
                                      [--examples-questions N] [--map-scale-prior S]
                                      [--layout words|letters]

``--map-scale-prior S`` (development only) fits the maps with another strength of the prior on their
scale than the server's (question_map.SCALE_PENALTY, 4), to see what a looser or tighter map would do.
``--layout L`` (development only) asks the server's reads in label layout L
(``extra.backend_options.labels``) instead of each type's kept one, to see what the maps would buy on
that layout's reads; give it a ``--reads`` file of its own (the cache doesn't know the layout).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tools.common.serving import key_headers, served_model, target, wait_ready
from tools.quality.accuracy import (
    DEFAULT_QUESTIONS,
    SHAPE_ERRORS,
    add_started_server_arguments,
    calibrated_env,
    report,
)
from tools.quality.accuracy_figures import Reading, question_id
from tools.quality.accuracy_rows import OURS, RowRefused, Servers
from tools.quality.labels_examples import (
    CachedReader,
    NotRead,
    choose_questions,
    engine_reader,
    examples_rows,
    plain_drift,
)
from tools.quality.labels_figures import (
    Lines,
    evaluate,
    question_names,
    summary,
    table,
)
from vllm.entrypoints.generate.decisions.calibration import (
    question_file,
    question_map,
)
from vllm.entrypoints.generate.decisions.calibration.examples import ShownReader
from vllm.entrypoints.generate.decisions.calibration.record import (
    CalibrationRecord,
)

DEFAULT_LABELS = str(Path(__file__).parent / "data" / "labels.jsonl")
# The rows asked of the server: the default reads of both files, the uncorrected ones of the held-out
# set (for batch calibration), a user's letter reads of both files.
ASKED = (
    ("default", "labels"),
    ("default", "heldout"),
    ("off", "heldout"),
    ("letters", "labels"),
    ("letters", "heldout"),
)
CACHED = ("default", "off", "letters", "shown")


def line_key(item: question_file.LabelledQuestion) -> str:
    """A line's cache key: its input and its question, so an edited line is asked again."""
    text = json.dumps([item.state, question_id(item)], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def load_reads(path: str | None, model: str) -> dict[str, dict[str, Any]]:
    """The cached reads per row (CACHED), each keyed by line_key; a cache another model's server read
    is refused, so two models' reads never mix."""
    if not path or not Path(path).exists():
        return {row: {} for row in CACHED}
    cached = json.loads(Path(path).read_text())
    if cached.get("model") != model:
        raise SystemExit(
            f"labels.py: {path} holds reads of {cached.get('model')}, not of {model} "
            "(--model names the model, also with --port)"
        )
    return {row: cached["reads"].get(row, {}) for row in CACHED}


def as_reading(record: dict[str, Any] | None) -> Reading:
    if record is None:
        return Reading([], error="not asked")
    return Reading(
        [float(s) for s in record["scores"]],
        float(record["temperature"]),
        error=record.get("error"),
    )


def missing(
    files: dict[str, list[question_file.LabelledQuestion]],
    reads: dict[str, dict[str, Any]],
) -> list[tuple[str, question_file.LabelledQuestion]]:
    """The (row, line) reads the cache lacks, one per distinct line (a failed read is kept: delete
    the cache to ask again)."""
    wanted = {
        (row, line_key(item)): (row, item)
        for row, name in ASKED
        for item in files[name]
        if line_key(item) not in reads[row]
    }
    return list(wanted.values())


async def ask(
    url: str,
    todo: list[tuple[str, question_file.LabelledQuestion]],
    reads: dict[str, dict[str, Any]],
    concurrency: int,
    model_path: str,
    api_key: str | None = None,
) -> None:
    """Ask each (row, line) once; record its answer or its error in ``reads``."""
    headers = key_headers(api_key)
    await wait_ready(url, headers=headers)
    print(f"asking {len(todo)} reads", file=sys.stderr)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as http:
        servers = Servers(http, await served_model(http), model_path)

        async def one(row: str, item: question_file.LabelledQuestion) -> None:
            async with gate:
                try:
                    reading = await servers.ask(row, item)
                    record: dict[str, Any] = {
                        "scores": reading.scores,
                        "temperature": reading.temperature,
                    }
                except RowRefused as refused:
                    record = {"scores": [], "temperature": 1.0, "error": str(refused)}
                except SHAPE_ERRORS as exc:
                    record = {
                        "scores": [],
                        "temperature": 1.0,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                reads[row][line_key(item)] = record
                done.append(row)
                if len(done) % 100 == 0:
                    print(f"{len(done)}/{len(todo)} reads", file=sys.stderr)

        done: list[str] = []
        await asyncio.gather(*(one(row, item) for row, item in todo))


def lines(items: list[question_file.LabelledQuestion], reads: dict[str, Any]) -> Lines:
    return Lines(items, [as_reading(reads.get(line_key(item))) for item in items])


def example_rows(
    args: argparse.Namespace,
    files: dict[str, list[question_file.LabelledQuestion]],
    reads: dict[str, dict[str, Any]],
    labels: Lines,
) -> dict[str, Any]:
    """The in-context example rows (labels_examples.py): from the cached reads with examples where
    they are all there, else with an in-process engine asking what the cache lacks."""
    if not args.saved_calibration:
        raise SystemExit("labels.py: --examples needs --saved-calibration")
    saved = json.loads(Path(args.saved_calibration).read_text())
    fits = CalibrationRecord.model_validate(saved)
    key = saved.get("key", {})
    print(
        f"saved calibration: render version {key.get('render_version')}, "
        f"debias {key.get('debias')}",
        file=sys.stderr,
    )
    heldout = lines(files["heldout"], reads["default"])
    questions = choose_questions(heldout.items, args.examples_questions)

    async def rows(reader: ShownReader | None) -> dict[str, list[dict[str, Any]]]:
        cached = CachedReader(reads["shown"], reader, line_key)
        try:
            return await examples_rows(
                labels,
                heldout,
                args.splits,
                args.labels_per_question,
                args.examples,
                cached,
                fits,
                args.seed,
                questions,
                args.precision,
            )
        finally:
            print(f"{cached.asked} reads with examples asked", file=sys.stderr)

    async def with_engine() -> dict[str, list[dict[str, Any]]]:
        async with engine_reader(args.model, args.dtype) as reader:
            drift = await plain_drift(labels, reader, fits)
            print(
                f"plain reads now vs cached: largest difference {drift:.2e}",
                file=sys.stderr,
            )
            return await rows(reader)

    try:
        measured = asyncio.run(rows(None))
    except NotRead:
        measured = asyncio.run(with_engine())
    return {name: summary(values) for name, values in measured.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_started_server_arguments(parser)
    parser.add_argument(
        "--labels", default=DEFAULT_LABELS, help="the operator's labels (%(default)s)"
    )
    parser.add_argument(
        "--heldout",
        default=DEFAULT_QUESTIONS,
        help="evaluated on only, never fitted on (%(default)s)",
    )
    parser.add_argument(
        "--reads", help="cache of the server's reads: reused when present, then updated"
    )
    parser.add_argument("--splits", type=int, default=5, help="draws of the labels")
    parser.add_argument(
        "--labels-per-question",
        type=int,
        default=20,
        help="labelled inputs drawn per question per split (%(default)s)",
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=0.8,
        help="the precision abstention is fitted for (%(default)s)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=0,
        help="in-context examples per question: adds the example rows, read in process (0: off)",
    )
    parser.add_argument(
        "--saved-calibration",
        help="with --examples: the calibration record whose layouts and corrections the reads "
        "with examples use (the one the cached plain reads were served with)",
    )
    parser.add_argument(
        "--examples-questions",
        type=int,
        help="with --examples: measure examples on only this many questions (in turn per type)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--seed", type=int, default=0, help="the splits' draws")
    parser.add_argument(
        "--map-scale-prior",
        type=float,
        help="development only: the maps' scale prior strength (the server's: "
        f"{question_map.SCALE_PENALTY:g})",
    )
    parser.add_argument(
        "--layout",
        choices=("letters", "words"),
        help="development only: ask the server's reads in this label layout",
    )
    args = parser.parse_args()
    if args.map_scale_prior is not None:
        question_map.SCALE_PENALTY = args.map_scale_prior
    if args.layout is not None:
        OURS["default"] = {"backend_options": {"labels": args.layout}}
    command = shlex.join([sys.executable, "-m", "tools.quality.labels", *sys.argv[1:]])
    try:
        files = {
            "labels": list(question_file.load(args.labels).questions),
            "heldout": list(question_file.load(args.heldout).questions),
        }
    except question_file.QuestionFileError as exc:
        raise SystemExit(f"labels.py: {exc}") from None
    started = time.perf_counter()
    reads = load_reads(args.reads, args.model)
    todo = missing(files, reads)
    if todo:
        try:
            with target(args, args.serve_port, calibrated_env(args)) as (url, _):
                asyncio.run(
                    ask(url, todo, reads, args.concurrency, args.model, args.api_key)
                )
        finally:
            if args.reads:
                Path(args.reads).write_text(
                    json.dumps({"model": args.model, "reads": reads}) + "\n"
                )
    read_seconds = time.perf_counter() - started
    results = evaluate(
        lines(files["labels"], reads["default"]),
        lines(files["heldout"], reads["default"]),
        args.splits,
        args.labels_per_question,
        args.precision,
        args.seed,
        off=lines(files["heldout"], reads["off"]).readings,
        letters=(
            lines(files["labels"], reads["letters"]),
            lines(files["heldout"], reads["letters"]),
        ),
    )
    if args.examples:
        try:
            results["rows"].update(
                example_rows(
                    args, files, reads, lines(files["labels"], reads["default"])
                )
            )
        finally:
            if args.reads:
                Path(args.reads).write_text(
                    json.dumps({"model": args.model, "reads": reads}) + "\n"
                )
    names = question_names(files["heldout"])
    results.update(
        command=command,
        model=args.model,
        labels=args.labels,
        heldout=args.heldout,
        splits=args.splits,
        labels_per_question=args.labels_per_question,
        precision=args.precision,
        date=time.strftime("%Y-%m-%d"),
        read_seconds=round(read_seconds),
        seconds=round(time.perf_counter() - started),
        question_names=names,
    )
    report(command, table(results, names), results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
