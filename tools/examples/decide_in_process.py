"""Decisions in process, over a vLLM engine you hold: the Python API (``bulk.Decisions``).

usage: .venv/bin/python -m tools.examples.decide_in_process MODEL [--dtype DTYPE]

Starts an ``AsyncLLM`` on MODEL, the decision service over it (the startup check, then the saved
calibration or a new one, as a server does), decides one request of each wire format and a stream of
requests, and prints each answer as JSON. No server, socket or HTTP client.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.generate.decisions.bulk import Decisions
from vllm.v1.engine.async_llm import AsyncLLM

TICKETS = [
    "Refund not received after 10 days.",
    "How do I change my avatar?",
    "Card charged twice!",
]


async def main(model: str, dtype: str) -> None:
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=model,
            dtype=dtype,
            enforce_eager=True,
            max_model_len=2048,
            enable_prefix_caching=True,
        )
    )
    try:
        # requests name it "m"
        decisions = await Decisions.start(engine, served_model="m")
        openai = await decisions.decide(
            {
                "model": "m",
                "input": TICKETS[0],
                "questions": [{"type": "predicate", "instructions": "Is it urgent?"}],
            }
        )
        print(json.dumps({"openai": [openai.status, openai.body]}))
        jev = await decisions.decide(
            {
                "state": TICKETS[2],
                "questions": {
                    "team": {
                        "type": "choice",
                        "instructions": "Which team?",
                        "criteria": {"billing": None, "tech": None},
                    }
                },
            },
            url="/v1/systemone",
        )
        print(json.dumps({"jev": [jev.status, jev.body]}))
        refused = await decisions.decide({"model": "m", "input": "x", "questions": []})
        print(json.dumps({"refused": [refused.status, refused.body]}))
        bodies = (
            {
                "model": "m",
                "input": ticket,
                "questions": [{"type": "predicate", "instructions": "Urgent?"}],
            }
            for ticket in TICKETS
        )
        async for result in decisions.decide_many(bodies, in_flight=2):
            print(
                json.dumps(
                    {"many": [result.status, result.body["answers"][0]["probability"]]}
                )
            )
    finally:
        engine.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--dtype", default="auto")
    options = parser.parse_args()
    asyncio.run(main(options.model, options.dtype))
