"""Stop the decision service's startup calibration on a real vLLM engine as ``vllm serve`` stops, then
start it again, and print what happened as JSON.

usage: stop_probe.py CHECKPOINT  (VLLM_TYPED_DECISIONS_* from the environment)

First start: once calibration's first pass is in force, the startup task is cancelled during the full
calibration (what the end of the server's event loop does). Second start, over the same engine and the
same saved results: its first decision, then the engine is shut down under its full calibration and
the task cancelled if it still runs (the launcher's order). The package's log records of each start
are printed with the answers. A separate process keeps vLLM's global state out of the test session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from argparse import Namespace

PACKAGE = "vllm.entrypoints.generate.decisions"


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(
            {
                "level": record.levelname,
                "message": record.getMessage(),
                "traceback": record.exc_info is not None,
            }
        )


async def until(condition, task: asyncio.Task) -> None:
    while not condition():
        if task.done():
            raise RuntimeError(f"startup ended first: {task.exception()!r}")
        await asyncio.sleep(0.05)


async def main(checkpoint: str) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.generate.decisions.bulk import Decisions
    from vllm.entrypoints.generate.decisions.runtime.startup import (
        build_service,
        start_served,
    )
    from vllm.v1.engine.async_llm import AsyncLLM

    kept = Kept()
    logger = logging.getLogger(PACKAGE)
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=checkpoint,
            dtype="float32",
            enforce_eager=True,
            max_model_len=2048,
            block_size=32,
            enable_prefix_caching=True,
        )
    )
    args = Namespace(model=checkpoint, served_model_name=["m"])
    out: dict = {}

    served = build_service(engine, args)
    starting = asyncio.create_task(start_served(served))
    readiness = served.base.readiness

    def first_pass_done() -> bool:
        if readiness.progress is not None and readiness.progress.unit == "reads":
            raise RuntimeError(
                "the first pass was not applied: the full calibration counts"
            )
        return readiness.ready

    await until(first_pass_done, starting)
    out["first"] = {
        "stage": served.base.calibrated.stage,
        "question_reads": served.base.calibrated.question_reads,
    }
    # The full calibration's first progress line: it is reading.
    await until(
        lambda: any("(full, in the background)" in r["message"] for r in kept.records),
        starting,
    )
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    out["first"]["log"], kept.records = kept.records, []

    served = build_service(engine, args)
    starting = asyncio.create_task(start_served(served))
    await until(lambda: served.base.readiness.ready, starting)
    answer = await Decisions(served).decide(
        {
            "model": "m",
            "input": "My payouts have been failing for 3 days.",
            "questions": [{"type": "predicate", "instructions": "Is this urgent?"}],
        }
    )
    out["second"] = {"status": answer.status, "body": answer.body}
    await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
    if not starting.done():
        starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    out["second"]["log"] = kept.records
    return out


if __name__ == "__main__":
    os.environ.update(TORCH_COMPILE_DISABLE="1", VLLM_CPU_KVCACHE_SPACE="1")
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
