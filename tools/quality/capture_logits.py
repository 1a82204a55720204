"""Capture raw option logits for a labelled question set from a running decision server.

Reads a question file in the operator format (or the bundled set), asks each question through
/v1/systemone, and writes one JSON line per answered question: its id, group, the correct option's
index and the raw option scores (``extra.backend.option_logits``, in option order). Feed the output
to tools/quality/fit_temperature.py to fit T offline, the same way the server does at startup.

usage: python -m tools.quality.capture_logits QUESTIONS.jsonl|bundled OUT.jsonl [--port 8000] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx

from vllm.entrypoints.generate.decisions.calibration import question_file


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("questions")
    parser.add_argument("out")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    questions = question_file.load(args.questions)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    answered = 0
    with (
        httpx.Client(
            base_url=f"http://127.0.0.1:{args.port}", timeout=300, headers=headers
        ) as client,
        open(args.out, "w", encoding="utf-8") as out,
    ):
        for item in questions.questions:
            body = {
                "state": item.state,
                "questions": {"q": item.raw},
                "extra": {"detail": "full"},
            }
            response = client.post("/v1/systemone", json=body)
            if response.status_code != 200:
                print(
                    f"{item.id}: {response.status_code} {response.text[:200]}",
                    file=sys.stderr,
                )
                continue
            logits = response.json()["answers"]["q"]["extra"]["backend"][
                "option_logits"
            ]
            scores = [float("-inf") if v is None else v for v in logits.values()]
            out.write(
                json.dumps(
                    {
                        "id": item.id,
                        "group": item.group,
                        "correct": item.correct,
                        "scores": scores,
                    }
                )
                + "\n"
            )
            answered += 1
    print(
        f"captured {answered}/{len(questions.questions)} questions from {questions.name} to {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
