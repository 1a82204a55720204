# SPDX-License-Identifier: Apache-2.0
"""``vllm run-batch`` with typed decisions on: decision lines answered in process as ``vllm serve``
answers them, other lines by vLLM's handlers. The file is streamed, in flight and read ahead bounded so
memory stays flat; lines read ahead go grouped by input (ReadAhead), so lines about one input share its
prefill while it is in the prefix cache. A rerun skips what is written (batch_file.py)."""

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
from types import SimpleNamespace
from typing import Any

from starlette.datastructures import State
from tqdm import tqdm

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    TooLong,
    Writer,
    line_fault,
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
# The text read ahead, and the text in flight, each stop growing at this many bodies of the largest size.
HELD_BODIES = 8


@dataclass
class Tally:
    """What the progress bar and the closing summary report."""

    lines: int = 0
    failed: int = 0
    skipped: int = 0
    # of the lines skipped, those an earlier run answered with an error
    failed_before: int = 0
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
        if isinstance(answers, dict):
            answers = answers.values()
        self.decisions += sum(a.get("type") != "refusal" for a in answers)
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
        """The failed lines of the whole output file, an earlier run's too."""
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
            problem = f"line {number}: expected an object with custom_id, method, url and body"
            return cls(number, text, None, problem)
        return cls(number, text, record)

    @classmethod
    def read(cls, number: int, text: str | TooLong, limit: int) -> Line:
        if isinstance(text, TooLong):
            return cls(number, "", None, too_long(number, text.size, limit))
        return cls.parse(number, text)

    @property
    def size(self) -> int:
        # its bytes, for the ASCII that JSON lines mostly are
        return len(self.text)

    @property
    def input_key(self) -> str:
        """The line's input or state, for grouping lines that share a prefill."""
        body = self.record.get("body") if self.record is not None else None
        if not isinstance(body, dict):
            return ""
        field = "input" if self.record and self.record["url"] == DECISIONS else "state"
        return json.dumps(body.get(field), sort_keys=True)[:4096]


class ReadAhead:
    """Up to ``window`` lines read ahead, handed out grouped by input, earliest input first. Reading
    also stops once the lines held reach ``budget`` (:attr:`Line.size` summed), always holding one."""

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
            key, group = next(iter(self.groups.items()))
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
    """At most ``lines`` lines in flight, and ``budget`` in :attr:`Line.size` (a larger line goes
    alone); one task waits to enter."""

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
    """(status, body, error, custom_id) of one input line; ``others`` answers vLLM's own URLs (None: not
    served). Never raises but for cancellation, so every line gets its output line."""
    try:
        if (record := line.record) is None:
            return None, None, {"code": "invalid_line", "message": line.problem}, None
        custom_id, url = record.get("custom_id"), record["url"]
        if url not in DECISION_PATHS:
            try:
                stock = others(url, line.text) if others is not None else None
            except ValueError as exc:
                # vLLM's own line model refused it (pydantic's error)
                error = {"code": "invalid_line", "message": str(exc)}
                return HTTPStatus.BAD_REQUEST, None, error, custom_id
            if stock is None:
                message = f"URL {url} is not served here (decision URLs: {', '.join(DECISION_PATHS)})"
                error = {"code": "unsupported_url", "message": message}
                return None, None, error, custom_id
            out = json.loads((await stock).model_dump_json())
            response = out.get("response") or {}
            status, body = response.get("status_code"), response.get("body")
            return status, body, out.get("error"), custom_id
        if record.get("method", "POST") != "POST":
            message = f"line {line.number}: only POST is supported"
            return None, None, {"code": "invalid_method", "message": message}, custom_id
        # the body as parsed from the line; the line is held to the body size limit
        result = await decisions.decide(
            record["body"], url, request_id, source=line.text.encode()
        )
        return result.status, result.body, None, custom_id
    except Exception:
        logger.exception(
            "decision batch: line %d (request %s) failed", line.number, request_id
        )
        custom_id = line.record.get("custom_id") if line.record is not None else None
        return None, None, line_fault(line.number, request_id), custom_id


@dataclass
class DecisionBatch:
    decisions: Decisions
    others: Callable[[str, str], Awaitable[Any] | None]
    writer: Writer
    tally: Tally
    progress: tqdm

    async def answer(self, line: Line) -> None:
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
    """Lines for vLLM's own run-batch endpoints, answered by its handler; None for a URL it lacks."""
    from vllm.entrypoints.launchers.run_batch import (
        BatchRequestInput,
        handle_endpoint_request,
    )

    no_progress = SimpleNamespace(submitted=lambda: None, completed=lambda: None)

    def handle(url: str, text: str) -> Awaitable[Any] | None:
        config = registry.get(url.split("/")[-1])
        if config is None or not config["url_matcher"](url):
            return None
        return handle_endpoint_request(
            BatchRequestInput.model_validate_json(text),
            no_progress,
            config["url_matcher"],
            config["handler_getter"],
            config["wrapper_fn"],
        )

    return handle
