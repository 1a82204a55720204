# SPDX-License-Identifier: Apache-2.0
"""Decisions over a Ray Data dataset (``pip install 'ray[data]'``; nothing else here imports Ray):
:func:`decisions_stage` gives ``map_batches`` arguments for a pool of actors, each an engine and the
decision service. Actors share startup records through a :class:`RecordBoard` actor, and a batch's rows
are emitted only once all are answered, so a batch Ray reruns emits none twice."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from http import HTTPStatus
from typing import Any, TypeVar

import ray

from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    TooLong,
    line_fault,
    output_line,
)
from vllm.entrypoints.generate.decisions.bulk.in_process import Decisions
from vllm.entrypoints.generate.decisions.bulk.run_batch import Line, answer_line
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import (
    name_run,
    share_records,
)
from vllm.entrypoints.generate.decisions.decide.errors import internal_error
from vllm.entrypoints.generate.decisions.decide.paths import DECISIONS
from vllm.entrypoints.generate.decisions.http.api_router import wire_at
from vllm.entrypoints.generate.decisions.http.wire.handling import new_request_id
from vllm.logger import init_logger

T = TypeVar("T")
logger = init_logger(__name__)


class Board:
    """The startup records of one stage's actors: the first to ask makes one, the others wait."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.making: dict[str, asyncio.Event] = {}
        self.started = 0
        # how often each record was made: once, unless a maker was waited out
        self.made: dict[str, int] = {}

    def join(self) -> int:
        """The ordinal of an actor starting (a restarted actor gets a new one)."""
        self.started += 1
        return self.started - 1

    async def take(self, name: str, wait_s: float) -> dict[str, Any] | None:
        while name not in self.records:
            making = self.making.get(name)
            # nobody is making it (or the maker failed): the caller makes it
            if making is None:
                self.making[name] = asyncio.Event()
                return None
            try:
                await asyncio.wait_for(making.wait(), wait_s)
            except TimeoutError:
                return None  # the maker is stuck or gone: the caller makes it too
        return self.records[name]

    def report(self) -> dict[str, Any]:
        return {"actors_started": self.started, "made": dict(self.made)}

    async def give(self, name: str, record: dict[str, Any] | None) -> None:
        if record is not None:
            self.records[name] = record
            self.made[name] = self.made.get(name, 0) + 1
        if (making := self.making.pop(name, None)) is not None:
            making.set()


RecordBoard = ray.remote(num_cpus=0)(Board)


class BoardRecords:
    """deployment_lock.SharedRecords over a :class:`RecordBoard`, for the actor's own event loop."""

    def __init__(self, board: Any) -> None:
        self.board = board

    async def take(self, name: str, wait_s: float) -> dict[str, Any] | None:
        return await self.board.take.remote(name, wait_s)

    async def give(self, name: str, record: dict[str, Any] | None) -> None:
        await self.board.give.remote(name, record)


def row_fault(url: Any, request_id: str) -> Any:
    """The internal error in the row's wire's shape (the OpenAI wire's for a URL of none)."""
    try:
        wire = wire_at(str(url or DECISIONS))
    except ValueError:
        wire = wire_at(DECISIONS)
    return wire.render_error(internal_error(request_id), None).json()


class DecisionStage:
    """One actor: an engine and its decision service. Ray Data hands it several batches at once (a
    thread each), all their rows at the engine at once (up to ``BULK_IN_FLIGHT``), never idle between."""

    def __init__(
        self,
        model: str,
        engine_args: dict[str, Any],
        served_model: str | None,
        board: Any,
        run: str,
        batch_lines: bool,
        actor_env: list[dict[str, str]],
    ) -> None:
        if actor_env:  # before the engine and the settings read them
            os.environ.update(actor_env[ray.get(board.join.remote()) % len(actor_env)])
        name_run(run)
        share_records(BoardRecords(board))
        self.batch_lines = batch_lines
        # The engine lives on an event loop of the actor's own, which Ray's batches are handed to.
        self.loop = asyncio.new_event_loop()
        threading.Thread(
            target=self.loop.run_forever, name="decisions", daemon=True
        ).start()
        self.engine, self.decisions = self._wait(
            self._start(model, engine_args, served_model)
        )
        self.gate = asyncio.Semaphore(self.decisions.service.settings.bulk_in_flight)

    @staticmethod
    async def _start(
        model: str, engine_args: dict[str, Any], served_model: str | None
    ) -> tuple[Any, Decisions]:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_args))
        try:
            return engine, await Decisions.start(engine, served_model=served_model)
        except BaseException:
            engine.shutdown()
            raise

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._wait(self._lines(batch) if self.batch_lines else self._rows(batch))

    async def _rows(self, batch: dict[str, Any]) -> dict[str, Any]:
        bodies = batch["body"]
        urls = batch.get("url", [DECISIONS] * len(bodies))
        ids = batch.get("request_id", [None] * len(bodies))

        async def one(body: Any, url: Any, request_id: Any) -> tuple[int, str, str]:
            rid = str(request_id or "") or new_request_id()
            try:
                async with self.gate:
                    # text: held to the body limit
                    value = dict(body) if isinstance(body, Mapping) else str(body)
                    result = await self.decisions.decide(
                        value, str(url or DECISIONS), rid
                    )
                response = json.dumps(result.body, ensure_ascii=False)
                return result.status, response, result.request_id
            except Exception:
                # this row is answered as a fault; the batch and its other rows go on
                logger.exception("decision stage: row %s failed", rid)
                response = json.dumps(row_fault(url, rid))
                return HTTPStatus.INTERNAL_SERVER_ERROR.value, response, rid

        answered = await asyncio.gather(*map(one, bodies, urls, ids))
        return {
            **batch,
            "status_code": [status for status, _, _ in answered],
            "response": [response for _, response, _ in answered],
            "request_id": [request_id for _, _, request_id in answered],
        }

    async def _lines(self, batch: dict[str, Any]) -> dict[str, Any]:
        limit = self.decisions.service.settings.max_body_bytes

        async def one(number: Any, text: Any) -> str:
            request_id = new_request_id()
            try:
                # Ray split the lines (read_text at every str.splitlines break, batch_file.lines at
                # \n only); one over the limit is refused unparsed, as run-batch does
                text = str(text)
                size = len(text.encode("utf-8", "surrogatepass"))
                line = Line.read(
                    int(number), TooLong(size) if size > limit else text, limit
                )
                async with self.gate:
                    status, body, error, custom_id = await answer_line(
                        self.decisions, line, request_id
                    )
                return output_line(
                    line.number, request_id, custom_id, status, body, error
                )
            except Exception:
                # answer_line doesn't raise; this guards the row's own fields
                logger.exception(
                    "decision stage: line %s (request %s) failed", number, request_id
                )
                error = line_fault(number, request_id)
                return output_line(int(number), request_id, None, None, None, error)

        return {"text": await asyncio.gather(*map(one, batch["line"], batch["text"]))}

    def __del__(self) -> None:
        if (engine := getattr(self, "engine", None)) is not None:
            engine.shutdown()


def decisions_stage(
    model: str,
    engine_args: Mapping[str, Any] | None = None,
    *,
    served_model: str | None = None,
    concurrency: int = 1,
    batch_size: int = 64,
    batches_per_actor: int = 4,
    batch_lines: bool = False,
    actor_env: Sequence[Mapping[str, str]] = (),
    **map_batches_args: Any,
) -> dict[str, Any]:
    """``Dataset.map_batches`` arguments for ``concurrency`` actors (rows and arguments: docs/bulk.md);
    the k-th actor started takes ``actor_env[k % len(actor_env)]``."""
    # Several calls at once on each actor, each waiting on the actor's own event loop for its rows.
    pool = ray.data.ActorPoolStrategy(
        size=concurrency,
        max_concurrent_calls_per_actor=batches_per_actor,
        enable_true_multi_threading=True,
    )
    return {
        "fn": DecisionStage,
        "fn_constructor_kwargs": {
            "model": model,
            "engine_args": dict(engine_args or {}),
            "served_model": served_model,
            "board": RecordBoard.remote(),
            "run": f"ray-stage-{uuid.uuid4().hex}",  # records only this run may reuse
            "batch_lines": batch_lines,
            "actor_env": [dict(env) for env in actor_env],
        },
        "compute": pool,
        "batch_size": batch_size,
        "batch_format": "numpy",
        **map_batches_args,
    }
