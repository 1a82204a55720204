"""How a server meets hostile clients. ``bodies`` (issue 38): how long it takes to refuse bodies that
ask for far more work than their size (nested JSON rendering to tens of millions of characters, long
questions to tokenize, the largest request that gets as far as tokenizing, a body just under the size
limit), each sent ``--copies`` times at once while /health is polled every 20 ms. ``bytes`` (issue 50,
byte_attacks.py): what hostile bytes cost the API server's memory per byte it accepted and another
client's decisions in latency, against a baseline measured in the same run, from ``--clients`` at once.

usage: python -m tools.bench.refusal_times [--model PATH] [--port N --server-pid PID [--api-key KEY]]
           [--only bodies|bytes] [--copies 1] [--clients 8] [--victims 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import httpx

from tools.bench import byte_attacks
from tools.common.serving import (
    add_key_argument,
    add_server_arguments,
    key_headers,
    target,
)

SENTENCE = "the quick brown fox jumps over the lazy dog "


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def words(chars: int) -> str:
    return (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def bodies(model: str) -> list[tuple[str, str, Any]]:
    """(what, path, body) for each class of hostile body, at the default limits."""
    noul = {
        "type": "noul",
        "instructions": nested(500),
        "criteria": {"true": nested(500)},
    }
    return [
        (
            "Jev, 16 questions of nested JSON",
            "/v1/systemone",
            {
                "state": "x",
                "questions": {
                    **{f"q{i}": noul for i in range(16)},
                    "last": {"type": "no-such-type"},
                },
            },
        ),
        (
            "OpenAI, 60 input_json parts",
            "/v1/decisions",
            {
                "model": model,
                "questions": [{"type": "predicate", "instructions": "?"}],
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_json", "data": nested(240)}] * 60,
                    }
                ],
            },
        ),
        (
            "Jev, 24 questions of 150 K characters",
            "/v1/systemone",
            {
                "state": "x",
                "questions": {
                    f"q{i}": {"type": "noul", "instructions": words(150_000)}
                    for i in range(24)
                },
            },
        ),
        (
            "OpenAI, 24 questions of 150 K characters",
            "/v1/decisions",
            {
                "model": model,
                "input": "x",
                "questions": [
                    {"type": "predicate", "instructions": words(150_000)}
                    for _ in range(24)
                ],
            },
        ),
        # The most a request can ask to be tokenized: 64 questions filling MAX_REQUEST_CHARS, each prompt
        # under what the context could hold by the characters-per-token bound, so each is tokenized.
        (
            "Jev, the largest request that is tokenized (64 questions of 62 K characters)",
            "/v1/systemone",
            {
                "state": "x",
                "questions": {
                    f"q{i}": {"type": "noul", "instructions": words(62_000)}
                    for i in range(64)
                },
            },
        ),
        (
            "Jev, a body just under MAX_BODY_BYTES (2 x 2 values of 999 K characters)",
            "/v1/systemone",
            {
                "state": "x",
                "questions": {
                    f"q{i}": {
                        "type": "noul",
                        "instructions": words(999_000),
                        "criteria": {"true": words(999_000)},
                    }
                    for i in range(2)
                },
            },
        ),
    ]


def measure(
    url: str, path: str, body: bytes, copies: int, api_key: str | None = None
) -> tuple[list[tuple[int, float, str]], list[float]]:
    refusals: list[tuple[int, float, str]] = []
    headers = {"content-type": "application/json", **key_headers(api_key)}

    def send() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            started = time.perf_counter()
            response = client.post(path, content=body, headers=headers)
            refusals.append(
                (
                    response.status_code,
                    time.perf_counter() - started,
                    response.text[:160],
                )
            )

    senders = [threading.Thread(target=send) for _ in range(copies)]
    health: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        client.get("/health")
        for sender in senders:
            sender.start()
        while any(sender.is_alive() for sender in senders):
            started = time.perf_counter()
            client.get("/health")
            health.append(time.perf_counter() - started)
            time.sleep(0.02)
    return refusals, health


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(parser, "nothing here")
    parser.add_argument(
        "--copies", type=int, default=1, help="copies of each body sent at once"
    )
    parser.add_argument(
        "--clients", type=int, default=8, help="hostile clients at once (bytes)"
    )
    parser.add_argument(
        "--victims",
        type=int,
        default=50,
        help="the other client's decisions per measurement (bytes)",
    )
    parser.add_argument("--only", choices=("bodies", "bytes"))
    add_key_argument(parser)
    args = parser.parse_args()
    with target(args, port=8193, env={"VLLM_TYPED_DECISIONS_CALIBRATION": "off"}) as (
        url,
        pid,
    ):
        if args.only != "bodies":
            if pid is None:
                parser.error(
                    "with --port, --server-pid names the API server to measure"
                )
            byte_attacks.run(
                url,
                pid,
                key_headers(args.api_key),
                args.clients,
                args.victims,
                lambda line: print(line, flush=True),
            )
            if args.only == "bytes":
                return
        # the OpenAI bodies name the model the server serves, so they get past its model check
        models = httpx.get(
            f"{url}/v1/models", headers=key_headers(args.api_key), timeout=30
        )
        models.raise_for_status()
        for what, path, value in bodies(models.json()["data"][0]["id"]):
            body = json.dumps(value, separators=(",", ":")).encode()
            refusals, health = measure(url, path, body, args.copies, args.api_key)
            statuses = ", ".join(
                f"{status} in {seconds:.2f} s"
                for status, seconds, _ in sorted(refusals)
            )
            polls = "no poll"
            if health:
                polls = f"median {statistics.median(health) * 1000:.0f} ms, worst {max(health) * 1000:.0f} ms"
            print(
                f"{what}: {len(body) / 1024:,.0f} KiB; {statuses}; /health x{len(health)}: {polls}",
                flush=True,
            )
            print(f"  {refusals[0][2]}", flush=True)


if __name__ == "__main__":
    main()
