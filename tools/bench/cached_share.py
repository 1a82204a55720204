"""Send multi-question decisions about fresh inputs to a running server and print the share of input
tokens the engine served from its prefix cache (usage.input_tokens_details.cached_tokens), then the
same again for the same inputs. Used for the figures in docs/scale-out.md: run it against one engine and
against ``--data-parallel-size 2`` to see whether the questions of one decision share one prefill.

usage: python -m tools.bench.cached_share [--url http://127.0.0.1:8000] [--requests 6] [--questions 8] [--words 800]
"""

from __future__ import annotations

import argparse
import random

import httpx

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "river", "stone", "cloud"]


def body(seed: int, questions: int, words: int) -> dict:
    draw = random.Random(seed)
    text = " ".join(draw.choice(WORDS) for _ in range(words))
    return {
        "model": "m",
        "input": f"Report {seed}: {text}",
        "extra": {"backend": "logit"},
        "questions": [
            {"type": "predicate", "instructions": f"Is point {i} true?"}
            for i in range(questions)
        ],
    }


def share(url: str, requests: int, questions: int, words: int, first_seed: int) -> str:
    total = cached = 0
    for seed in range(first_seed, first_seed + requests):
        response = httpx.post(
            f"{url}/v1/decisions", json=body(seed, questions, words), timeout=300
        )
        response.raise_for_status()
        usage = response.json()["usage"]
        total += usage["input_tokens"]
        cached += usage["input_tokens_details"]["cached_tokens"]
    return f"{cached / total:.3f} ({cached}/{total} input tokens)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--words", type=int, default=800)
    args = parser.parse_args()
    seed = random.randrange(1 << 30)  # fresh inputs: nothing cached from an earlier run
    print(
        "fresh inputs:",
        share(args.url, args.requests, args.questions, args.words, seed),
    )
    print(
        "same again:  ",
        share(args.url, args.requests, args.questions, args.words, seed),
    )


if __name__ == "__main__":
    main()
