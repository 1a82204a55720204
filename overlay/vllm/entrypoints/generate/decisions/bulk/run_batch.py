# SPDX-License-Identifier: Apache-2.0
"""``vllm run-batch`` with typed decisions on (patches/api-router-wire).

Decision lines (``url`` ``/v1/decisions``, ``/v1/systemone`` or ``/api/alpha/decisions``) are answered
in process (in_process.py) by the wire handling the server's routes run: the same answers, refusals
and error bodies as ``vllm serve``. Each line's body is passed on as parsed from the line, and each
line gets one request id, which its output line and its response's id both carry. Every other line
goes to vLLM's own run-batch handlers. Unlike stock run-batch, the file is streamed: lines are read,
answered and written as they go, at most ``VLLM_TYPED_DECISIONS_BULK_IN_FLIGHT`` at once and
``VLLM_TYPED_DECISIONS_BULK_WINDOW`` read ahead, either also stopping at :data:`HELD_BODIES` bodies of
the largest size (``VLLM_TYPED_DECISIONS_MAX_BODY_BYTES``) in text, so memory stays flat however long
the file and however long its lines; a line over that size is refused unread, in place. A rerun with
the same output file skips what is already there (batch_file.py).

The lines read ahead are submitted grouped by their input (ReadAhead), so lines about one input reach
the engine together and share its prefill while it is in the prefix cache, however far apart they are
in the file within the window (under data parallelism they also go to one replica: vllm_host.replica_for). An
online server sees them in file order, and an input evicted between two of its lines is prefilled twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from argparse import Namespace
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from starlette.datastructures import State
from tqdm import tqdm

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    TooLong,
    Writer,
    lines,
    output_line,
    resume,
    too_long,
    unreadable,
)
from vllm.entrypoints.generate.decisions.bulk.in_process import Decisions
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.paths import DECISION_PATHS, DECISIONS
from vllm.entrypoints.generate.decisions.http.wire.body import parse_json
from vllm.entrypoints.generate.decisions.http.wire.handling import new_request_id
from vllm.entrypoints.generate.decisions.runtime.adapters import ServedModels
from vllm.logger import init_logger

logger = init_logger(__name__)

# The exit status of a run that answered every line but some with an error (1 is a run that stopped).
FAILED_LINES_EXIT = 3
# The text held by read-ahead, and the text in flight, each stop growing at this many bodies of the
# largest size: lines of a few kB stay bounded by the line counts, lines of megabytes by this.
HELD_BODIES = 8


@dataclass
class Tally:
    """What the progress bar and the closing summary report."""

    lines: int = 0
    failed: int = 0
    skipped: int = 0
    failed_before: int = (
        0  # of the lines skipped, those an earlier run answered with an error
    )
    decisions: int = 0  # questions answered
    input_tokens: int = 0
    cached_tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    def count(self, status: int | None, body: Any) -> None:
        self.lines += 1
        if status != HTTPStatus.OK:
            self.failed += 1
            return
        if not isinstance(body, dict):
            return
        answers = body.get("answers", ())
        self.decisions += sum(
            1
            for a in (answers.values() if isinstance(answers, dict) else answers)
            if a.get("type") != "refusal"
        )
        usage = body.get("usage", {})
        self.input_tokens += int(usage.get("input_tokens", 0))
        self.cached_tokens += int(
            usage.get("input_tokens_details", {}).get("cached_tokens", 0)
        )

    def summary(self) -> str:
        seconds = time.monotonic() - self.started
        cached = (
            f", {self.cached_tokens / self.input_tokens:.1%} of {self.input_tokens} input tokens cached"
            if self.input_tokens
            else ""
        )
        earlier = (
            f" ({self.failed_before} of them failed)" if self.failed_before else ""
        )
        return (
            f"decision batch: {self.lines} lines in {seconds:.1f} s ({self.failed} failed, {self.skipped} "
            f"already answered{earlier}), {self.decisions} decisions, {self.decisions / max(seconds, 1e-9):.1f} "
            f"decisions/s{cached}"
        )

    @property
    def all_failed(self) -> int:
        """The failed lines of the whole output file: this run's and those an earlier run wrote."""
        return self.failed + self.failed_before


@dataclass(frozen=True)
class Line:
    """One input line, parsed once: its request, or why it isn't one."""

    number: int
    text: str
    record: dict[str, Any] | None
    problem: str | None = None

    @classmethod
    def parse(cls, number: int, text: str) -> Line:
        if (problem := unreadable(number, text)) is not None:
            return cls(number, text, None, problem)
        try:  # as strictly as the server parses a body: a key twice, NaN, a lone surrogate are refused
            record = parse_json(text.encode())
        except DecisionError as exc:
            return cls(number, text, None, f"line {number}: {exc.message}")
        except Exception:
            # whatever else: this line is answered as unreadable, the others go on
            logger.exception("decision batch: line %d could not be parsed", number)
            return cls(number, text, None, f"line {number}: could not be read as JSON")
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("url"), str)
            or "body" not in record
        ):
            return cls(
                number,
                text,
                None,
                f"line {number}: expected an object with custom_id, method, url and body",
            )
        return cls(number, text, record)

    @classmethod
    def read(cls, number: int, text: str | TooLong, limit: int) -> Line:
        """Line ``number`` as batch_file.lines read it: parsed, or refused unread when too long."""
        if isinstance(text, TooLong):
            return cls(number, "", None, too_long(number, text.size, limit))
        return cls.parse(number, text)

    @property
    def size(self) -> int:
        """How much text the line holds (its bytes, for the ASCII that JSON lines mostly are)."""
        return len(self.text)

    @property
    def input_key(self) -> str:
        """What the line's decision is about (its input or state), for grouping lines that share a prefill."""
        body = self.record.get("body") if self.record is not None else None
        if not isinstance(body, dict):
            return ""
        field = "input" if self.record and self.record["url"] == DECISIONS else "state"
        return json.dumps(body.get(field), sort_keys=True)[:4096]


class ReadAhead:
    """Up to ``window`` lines read ahead, handed out grouped by input: all the lines held about the input
    that first appeared earliest, then the next input's, reading on as lines go. Two lines about one
    input less than ``window`` lines apart come out together (or the later one soon after). Reading
    also stops once the lines held reach ``budget`` (their :attr:`Line.size` summed), so long lines are
    held by the few: at most ``budget`` less one, plus the last line read, and always one line."""

    def __init__(self, source: Iterable[Line], window: int, budget: int) -> None:
        self.source = iter(source)
        self.window = window
        self.budget = budget
        self.groups: dict[str, deque[Line]] = {}  # first appearance first
        self.held = 0
        self.held_size = 0

    def __iter__(self) -> Iterator[Line]:
        while True:
            self.fill()
            if not self.groups:
                return
            key = next(iter(self.groups))
            group = self.groups[key]
            line = group.popleft()
            if not group:
                del self.groups[key]
            self.held -= 1
            self.held_size -= line.size
            yield line

    def fill(self) -> None:
        while (
            self.held < self.window
            and (not self.held or self.held_size < self.budget)
            and (line := next(self.source, None)) is not None
        ):
            self.groups.setdefault(line.input_key, deque()).append(line)
            self.held += 1
            self.held_size += line.size


class InFlight:
    """At most ``lines`` lines in flight, and of them at most ``budget`` in :attr:`Line.size` summed; a
    line larger than that goes alone. One task waits to enter (the loop submitting lines)."""

    def __init__(self, lines: int, budget: int) -> None:
        self.lines = lines
        self.budget = budget
        self.count = 0
        self.size = 0
        self.left = asyncio.Event()

    async def enter(self, size: int) -> None:
        while self.count and (
            self.count >= self.lines or self.size + size > self.budget
        ):
            self.left.clear()
            await self.left.wait()
        self.count += 1
        self.size += size

    def leave(self, size: int) -> None:
        self.count -= 1
        self.size -= size
        self.left.set()


async def answer_line(
    decisions: Decisions,
    line: Line,
    request_id: str,
    others: Callable[[str, str], Awaitable[Any] | None] | None = None,
) -> tuple[int | None, Any, Any, Any]:
    """(status, body, error, custom_id) of one input line; a line that isn't a request gets only an error.
    ``others`` answers lines for vLLM's own run-batch URLs (None for a URL it doesn't serve); without it,
    only decision URLs are served. Never raises (but for cancellation): a fault answering the line is
    its ``internal_error``, logged under ``request_id``, so every line gets its output line."""
    try:
        return await _answer_line(decisions, line, request_id, others)
    except Exception:
        logger.exception(
            "decision batch: line %d (request %s) failed", line.number, request_id
        )
        custom_id = line.record.get("custom_id") if line.record is not None else None
        message = f"line {line.number}: internal error; the log has the details (look for {request_id})"
        return None, None, {"code": "internal_error", "message": message}, custom_id


async def _answer_line(
    decisions: Decisions,
    line: Line,
    request_id: str,
    others: Callable[[str, str], Awaitable[Any] | None] | None,
) -> tuple[int | None, Any, Any, Any]:
    record = line.record
    if record is None:
        return None, None, {"code": "invalid_line", "message": line.problem}, None
    custom_id, url = record.get("custom_id"), record["url"]
    if url not in DECISION_PATHS:
        try:
            stock = others(url, line.text) if others is not None else None
        except (
            ValueError
        ) as exc:  # vLLM's own line model refused it (pydantic's error is a ValueError)
            return (
                HTTPStatus.BAD_REQUEST,
                None,
                {"code": "invalid_line", "message": str(exc)},
                custom_id,
            )
        if stock is None:
            message = f"URL {url} is not served here (decision URLs: {', '.join(DECISION_PATHS)})"
            return (
                None,
                None,
                {"code": "unsupported_url", "message": message},
                custom_id,
            )
        out = json.loads((await stock).model_dump_json())
        response = out.get("response") or {}
        return (
            response.get("status_code"),
            response.get("body"),
            out.get("error"),
            custom_id,
        )
    if record.get("method", "POST") != "POST":
        message = f"line {line.number}: only POST is supported"
        return None, None, {"code": "invalid_method", "message": message}, custom_id
    # The body as parsed from the line (as strictly as the server parses one); the line is held to
    # the body size limit.
    result = await decisions.decide(
        record["body"], url, request_id, source=line.text.encode()
    )
    return result.status, result.body, None, custom_id


class DecisionBatch:
    def __init__(
        self,
        decisions: Decisions,
        others: Callable[[str, str], Awaitable[Any] | None],
        writer: Writer,
        tally: Tally,
        progress: tqdm,
    ) -> None:
        self.decisions = decisions
        self.others = others
        self.writer = writer
        self.tally = tally
        self.progress = progress

    async def answer(self, line: Line) -> None:
        # the line's one id: its output line's and its response's
        request_id = new_request_id()
        status, body, error, custom_id = await answer_line(
            self.decisions, line, request_id, self.others
        )
        self.writer.write(
            output_line(line.number, request_id, custom_id, status, body, error)
        )
        self.tally.count(status, body)
        self.progress.update()
        self.progress.set_postfix(
            decisions_per_s=f"{self.tally.decisions / (time.monotonic() - self.tally.started):.1f}",
            failed=self.tally.failed,
            refresh=False,
        )


async def run_decision_batch(
    engine_client: EngineClient, args: Namespace, registry: dict[str, Any], state: State
) -> None:
    """The whole batch: wait for the decision startup work, then stream the file through."""
    service: ServedModels | None = getattr(state, "decision_service", None)
    if service is None:
        raise SystemExit(
            "decision batch: this model serves no decisions (it supports neither generate nor "
            "token_classify)"
        )
    await service.readiness.settled()
    if (startup := getattr(state, "decision_startup", None)) is not None:
        await startup  # then the startup work of each --lora-modules adapter
    # an adapter's line waits for its startup work rather than failing
    service.wait_for_start = True
    if service.readiness.failure is not None:
        raise SystemExit(
            f"decision batch: decisions are unavailable on this model: {service.readiness.failure}"
        )
    source, target = Path(args.input_file), Path(args.output_file)
    if not source.is_file():
        raise SystemExit(
            f"decision batch: {args.input_file} is not a local file (decision batches are streamed "
            "from a local input file to a local output file)"
        )
    done = resume(target)
    if done:
        logger.info(
            "decision batch: %d lines of %s already answered; answering the rest",
            len(done),
            target,
        )
    settings = service.settings
    limit, budget = settings.max_body_bytes, HELD_BODIES * settings.max_body_bytes
    tally = Tally(skipped=0, failed_before=done.failed)
    writer = Writer(target)
    gate = InFlight(settings.bulk_in_flight, budget)
    tasks: set[asyncio.Task[None]] = set()
    # A task that fails (answer_line never raises: writing the output did) stops the run: not dropped.
    faults: list[BaseException] = []

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and (fault := task.exception()) is not None:
            faults.append(fault)

    def unanswered() -> Iterator[Line]:
        for number, text in lines(source, limit):
            if number in done:
                tally.skipped += 1
            else:
                yield Line.read(number, text, limit)

    with tqdm(unit="line", desc="Decision batch", mininterval=2) as progress:
        batch = DecisionBatch(
            Decisions(service), stock_handler(registry), writer, tally, progress
        )

        async def run(line: Line) -> None:
            try:
                await batch.answer(line)
            finally:
                gate.leave(line.size)

        for line in ReadAhead(unanswered(), settings.bulk_window, budget):
            await gate.enter(line.size)
            if faults:
                break
            task = asyncio.create_task(run(line))
            tasks.add(task)
            task.add_done_callback(finished)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    writer.close()
    logger.info(tally.summary())
    # the lines not written are answered by a rerun with the same output file
    if faults:
        raise faults[0]
    if tally.all_failed:
        logger.error(
            "decision batch: %d of %d lines in %s failed (their output lines' error, or a status_code "
            "other than 200, says why)",
            tally.all_failed,
            tally.lines + tally.skipped,
            target,
        )
        raise SystemExit(FAILED_LINES_EXIT)


def stock_handler(
    registry: dict[str, Any],
) -> Callable[[str, str], Awaitable[Any] | None]:
    """A line for one of vLLM's own run-batch endpoints, answered by vLLM's handler; None for a URL
    vLLM doesn't serve either."""
    from vllm.entrypoints.launchers.run_batch import (
        BatchRequestInput,
        handle_endpoint_request,
    )

    class NoProgress:
        def submitted(self) -> None: ...

        def completed(self) -> None: ...

    def handle(url: str, text: str) -> Awaitable[Any] | None:
        config = registry.get(url.split("/")[-1])
        if config is None or not config["url_matcher"](url):
            return None
        request = BatchRequestInput.model_validate_json(text)
        return handle_endpoint_request(
            request,
            NoProgress(),
            config["url_matcher"],
            config["handler_getter"],
            config["wrapper_fn"],
        )

    return handle
