"""Measure how much next-token probability the served model puts on the option letters.

Sends a small fixed set of easy questions (yes/no, choice, score) to a running server's
``/v1/decisions`` and prints each answer's ``extra.audit.option_mass`` and the mean. A mass near 1
means the prompt's answer slot works for this model; a low mass means the model wants to write
something else first.

usage: python -m tools.quality.option_mass [--port 8000]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import httpx

QUESTIONS = [
    (
        "The sky is blue and the sun is shining.",
        {"type": "predicate", "instructions": "Is it sunny?"},
    ),
    (
        "It is raining hard and the streets are flooded.",
        {"type": "predicate", "instructions": "Is it sunny?"},
    ),
    (
        "Ticket: My payouts have been failing for 3 days.",
        {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "choices": [
                {"value": "billing", "description": "Payments, refunds"},
                {"value": "technical", "description": "Bugs, outages"},
            ],
        },
    ),
    (
        "Paris is the capital of France.",
        {
            "type": "choice",
            "instructions": "What is the capital of France?",
            "choices": [{"value": v} for v in ("Berlin", "Paris", "Rome", "Madrid")],
        },
    ),
    (
        "I am so angry, this is the third time you have lost my order!",
        {
            "type": "score",
            "instructions": "How frustrated is the customer?",
            "levels": [
                {"label": "Calm"},
                {"label": "Frustrated"},
                {"label": "Very angry"},
            ],
        },
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    masses = []
    # The name the server serves its model under (tools/serve.sh: smollm2 or qwen).
    model = httpx.get(f"http://127.0.0.1:{args.port}/v1/models", timeout=30).json()[
        "data"
    ][0]["id"]
    for state, question in QUESTIONS:
        body = {
            "model": model,
            "input": state,
            "questions": [question],
            "extra": {"detail": "full"},
        }
        response = httpx.post(
            f"http://127.0.0.1:{args.port}/v1/decisions", json=body, timeout=120
        )
        response.raise_for_status()
        answer = response.json()["answers"][0]
        mass = answer["extra"]["audit"]["option_mass"]
        masses.append(mass)
        print(f"{mass:.3f}  {question['type']:9s} {question['instructions']}")
    print(
        f"mean option_mass {statistics.mean(masses):.3f}, min {min(masses):.3f} over {len(masses)} questions"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
