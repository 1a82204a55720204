"""Benchmark: wide-direct against two-stage on the same choice questions, at several option counts.

Sends each question twice to a running server's /v1/decisions (once per readout, one question per
request, one request at a time) and prints, per option count, the median server-side time per
question for each readout, their ratio, and how often the two pick the same option. Times come from
the ``x-decision-latency-ms`` header. Questions are synthetic: a state names one item among many.

usage: python -m tools.bench.bench_readouts [--port 8000] [--sizes 32 64 255] [--questions 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import httpx

ITEMS = [
    "apple",
    "river",
    "candle",
    "violin",
    "harbor",
    "falcon",
    "meadow",
    "copper",
    "lantern",
    "glacier",
    "saddle",
    "orchid",
    "compass",
    "tunnel",
    "marble",
    "thistle",
    "beacon",
    "walnut",
    "anchor",
    "prism",
]


def question(size: int, rng: random.Random) -> tuple[str, dict, str]:
    names = [f"{rng.choice(ITEMS)}-{i}" for i in range(size)]
    answer = rng.randrange(size)
    state = f"Inventory note: the only item that shipped today was {names[answer]}. Everything else is on hold."
    return (
        state,
        {
            "type": "choice",
            "instructions": "Which item shipped today?",
            "choices": [{"value": name} for name in names],
        },
        names[answer],
    )


def ask(
    client: httpx.Client, state: str, q: dict, readout: str
) -> tuple[float, str, int]:
    model = client.get("/v1/models").json()["data"][0][
        "id"
    ]  # the name the server serves its model under
    body = {
        "model": model,
        "input": state,
        "questions": [q],
        "extra": {"detail": "full", "backend_options": {"readout": readout}},
    }
    response = client.post("/v1/decisions", json=body)
    response.raise_for_status()
    answer = response.json()["answers"][0]
    return (
        float(response.headers["x-decision-latency-ms"]),
        answer["choice"],
        answer["extra"]["audit"]["forward_passes"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 255])
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(
        "| options | wide-direct ms/question | two-stage ms/question | two-stage / wide-direct "
        "| passes (wide, two-stage) | same answer | correct (wide, two-stage) |"
    )
    print("|---|---|---|---|---|---|---|")
    with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=600) as client:
        for size in args.sizes:
            wide, two, same, passes, right = [], [], 0, (0, 0), [0, 0]
            for _ in range(args.questions):
                state, q, expected = question(size, rng)
                # Alternate which readout goes first, so neither always gets the warmer prefix cache.
                order = (
                    ["wide-direct", "two-stage"]
                    if len(wide) % 2 == 0
                    else ["two-stage", "wide-direct"]
                )
                results = {readout: ask(client, state, q, readout) for readout in order}
                wide.append(results["wide-direct"][0])
                two.append(results["two-stage"][0])
                same += results["wide-direct"][1] == results["two-stage"][1]
                right[0] += results["wide-direct"][1] == expected
                right[1] += results["two-stage"][1] == expected
                passes = (results["wide-direct"][2], results["two-stage"][2])
            w, t = statistics.median(wide), statistics.median(two)
            n = args.questions
            print(
                f"| {size} | {w:.0f} | {t:.0f} | {t / w:.1f}x | {passes[0]}, {passes[1]} | {same}/{n} "
                f"| {right[0]}/{n}, {right[1]}/{n} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
