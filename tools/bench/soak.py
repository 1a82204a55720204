"""A bounded soak of the decision endpoints: mixed traffic at fixed concurrency, every answer checked.

Sends seeded, mixed requests (both endpoints and the alias; yes/no, choice and score questions; one to
eight questions; states from a few words to about 1,500 tokens, some as JSON; about one in ten
invalid on purpose) from ``concurrency`` workers for ``seconds``, and checks every response: an
answer must be well formed (the OpenAI SDK's own ``Decision`` type parses it, one answer or refusal
per question, probabilities that sum to 1), an invalid request must get a 4xx with a message, and
nothing may be a 5xx. It samples the server's memory (API server plus engine processes) as it goes.

usage: python -m tools.bench.soak [--model PATH] [--port N --server-pid PID] [--seconds 600] [--concurrency 8]
                                  [--baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tools.common.serving import (
    add_server_arguments,
    api_and_engine,
    served_model,
    target,
)

WORDS = [
    "ticket",
    "payout",
    "refund",
    "invoice",
    "login",
    "outage",
    "delay",
    "customer",
    "order",
    "shipment",
    "contract",
    "renewal",
]
PATHS = ("/v1/decisions", "/v1/systemone", "/api/alpha/decisions")


@dataclass
class Case:
    path: str
    body: Any
    valid: bool


@dataclass
class Tally:
    served: Counter = field(default_factory=Counter)  # by status
    # unexpected outcomes, first few kept in full
    errors: list[str] = field(default_factory=list)
    # (seconds, API MiB, engine MiB)
    memory_mib: list[tuple[float, float, float]] = field(default_factory=list)

    def fail(self, case: Case, why: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{case.path} {why}: {json.dumps(case.body)[:300]}")
        self.served["unexpected"] += 1


def state(rng: random.Random) -> str:
    words = rng.choice((3, 40, 200, 1000))
    return " ".join(rng.choice(WORDS) for _ in range(words))


def question(rng: random.Random, jev: bool, index: int) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(("yes/no", "choice", "score"))
    name = f"q{index}"
    if kind == "yes/no":
        return name, {
            "type": "noul" if jev else "predicate",
            "instructions": f"Is it about {rng.choice(WORDS)}?",
        }
    if kind == "choice":
        values = [
            f"{w} {i}"
            for i, w in enumerate(rng.sample(WORDS * 4, rng.choice((2, 5, 12, 40))))
        ]
        if jev:
            return name, {
                "type": "choice",
                "instructions": "Which fits?",
                "criteria": dict.fromkeys(values),
            }
        return name, {
            "type": "choice",
            "instructions": "Which fits?",
            "choices": [{"value": v} for v in values],
        }
    levels = [f"level {i}" for i in range(rng.randint(3, 10))]
    if jev:
        return name, {"type": "score", "instructions": "How much?", "criteria": levels}
    return name, {
        "type": "score",
        "instructions": "How much?",
        "levels": [{"label": label} for label in levels],
    }


def spoil(rng: random.Random, body: dict[str, Any], jev: bool) -> dict[str, Any]:
    """One mistake a client might make."""
    key = "questions"
    mistake = rng.choice(
        ("wrong type", "missing questions", "unknown type", "unknown field", "too many")
    )
    if mistake == "wrong type":
        body[key] = "not questions"
    elif mistake == "missing questions":
        body.pop(key)
    elif mistake == "unknown type":
        body[key] = {"x": {"type": "tarot"}} if jev else [{"type": "tarot"}]
    elif mistake == "unknown field":
        body["extra"] = {"temperature_of_the_sun": 5778}
    else:
        count = 1000
        body[key] = (
            {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(count)}
            if jev
            else [{"type": "predicate", "instructions": "?"}] * count
        )
    return body


def case(rng: random.Random, model: str) -> Case:
    path = rng.choice(PATHS)
    jev = path != "/v1/decisions"
    count = rng.choice((1, 1, 2, 4, 8))
    named = [question(rng, jev, i) for i in range(count)]
    text = state(rng)
    if jev:
        body: dict[str, Any] = {
            "state": {"note": text, "tags": WORDS[:3]} if rng.random() < 0.2 else text,
            "questions": dict(named),
        }
    else:
        body = {"model": model, "input": text, "questions": [q for _, q in named]}
    valid = rng.random() >= 0.1
    return Case(path, body if valid else spoil(rng, body, jev), valid)


def check(case: Case, response: httpx.Response, tally: Tally) -> None:
    status = response.status_code
    tally.served[status] += 1
    if status >= 500:
        return tally.fail(case, f"{status} {response.text[:200]}")
    if not case.valid:
        if status < 400 or not response.text:
            tally.fail(case, f"invalid request answered {status}")
        return None
    if status != 200:
        return tally.fail(case, f"valid request refused {status} {response.text[:200]}")
    try:
        well_formed(case.path, case.body, response.json())
    except (AssertionError, KeyError, ValueError, TypeError) as exc:
        tally.fail(case, f"malformed answer ({exc!r}): {response.text[:200]}")
    return None


def well_formed(path: str, request: dict[str, Any], body: dict[str, Any]) -> None:
    """Raises unless ``body`` is a well-formed 200 answer to ``request`` on ``path``: one answer (or
    refusal) per question, probabilities that sum to 1, and on /v1/decisions the OpenAI SDK's own type."""
    if path == "/v1/decisions":
        from openai.types import Decision

        # OpenAI's types know its own answer types; a plugin question type's answer is checked below only.
        openai_answers = [
            a
            for a in body["answers"]
            if a["type"] in ("predicate", "choice", "score", "refusal")
        ]
        Decision.model_validate({**body, "answers": openai_answers})
        assert len(body["answers"]) == len(request["questions"])
        for answer in body["answers"]:
            listed = answer.get("probabilities", [])
            # OpenAI's types list {value, probability}; a plugin type's answer keys them by option key.
            sums_to_one(
                list(listed.values())
                if isinstance(listed, dict)
                else [p["probability"] for p in listed]
            )
    else:
        answered = set(body["answers"]) | set(body.get("partial_failures", {}))
        assert answered == set(request["questions"])
        for answer in body["answers"].values():
            sums_to_one(list(answer.get("probabilities", {}).values()))


def sums_to_one(probabilities: list[float]) -> None:
    assert not probabilities or math.isclose(sum(probabilities), 1.0, abs_tol=1e-6), (
        probabilities
    )


def rss_mib(pid: int | None) -> tuple[float, float]:
    """Resident memory (MiB) of the API-server process, and of the engine processes it started."""
    return api_and_engine(pid, lambda process: process.memory_info().rss / 2**20)


def bare(c: Case, model: str) -> Case:
    """The baseline for ``c``: its input and first question as one prompt to vLLM's own /v1/completions."""
    body = c.body if isinstance(c.body, dict) else {}
    text = body.get("input") or body.get("state") or ""
    questions = body.get("questions")
    first = (
        list(questions.values()) if isinstance(questions, dict) else questions or [{}]
    )[0]
    question = first.get("instructions", "") if isinstance(first, dict) else ""
    prompt = f"{json.dumps(text) if not isinstance(text, str) else text}\n\nQuestion: {question}\nAnswer:"
    return Case(
        "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": 1, "logprobs": 5},
        True,
    )


async def soak(
    url: str,
    seconds: float,
    concurrency: int,
    seed: int = 0,
    server_pid: int | None = None,
    sample_every: float = 10.0,
    baseline: bool = False,
) -> Tally:
    """Run the soak against ``url``; returns what was served and anything unexpected. ``baseline``
    sends the same inputs to vLLM's own /v1/completions instead (one plain prompt each), to compare
    the server's memory curve with and without the decision path."""
    rng = random.Random(seed)
    tally = Tally()
    started = time.monotonic()
    deadline = started + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        model = await served_model(client)
        while time.monotonic() < deadline:
            c = case(rng, model)
            c = bare(c, model) if baseline else c
            response = await client.post(c.path, json=c.body)
            if baseline:
                tally.served[response.status_code] += 1
            else:
                check(c, response, tally)

    async def sampler() -> None:
        while time.monotonic() < deadline:
            tally.memory_mib.append((time.monotonic() - started, *rss_mib(server_pid)))
            await asyncio.sleep(sample_every)
        tally.memory_mib.append((time.monotonic() - started, *rss_mib(server_pid)))

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await asyncio.gather(sampler(), *(worker(client) for _ in range(concurrency)))
    return tally


def report(tally: Tally, seconds: float, concurrency: int) -> str:
    total = sum(v for k, v in tally.served.items() if k != "unexpected")
    memory = tally.memory_mib
    lines = [
        f"soak: {seconds:.0f} s at concurrency {concurrency}: {total} requests, statuses "
        + ", ".join(f"{k}: {v}" for k, v in sorted(tally.served.items(), key=str)),
        f"unexpected outcomes: {tally.served['unexpected']}",
    ]
    lines += [f"  {error}" for error in tally.errors]
    if memory and memory[-1][1]:
        curve = ", ".join(
            f"{t:.0f}s {api:.0f}+{engine:.0f}" for t, api, engine in memory
        )
        lines.append(f"server memory (MiB RSS, API server + engine processes): {curve}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_server_arguments(parser, "the memory curve")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="the same inputs through vLLM's /v1/completions",
    )
    args = parser.parse_args()
    with target(args, port=8192) as (url, pid):
        tally = asyncio.run(
            soak(url, args.seconds, args.concurrency, args.seed, pid, 30, args.baseline)
        )
    print(report(tally, args.seconds, args.concurrency))
    return 1 if tally.served["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
