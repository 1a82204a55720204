"""Send the README's sample decision to a running server and print the answers.

Waits (up to --wait seconds) while the server is starting: decision requests answer 503 until the
decision startup work is done, so this polls a decision request rather than /health.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import httpx

SAMPLE = {
    "model": "default",
    "input": "Ticket: My payouts have been failing for 3 days and I need the money today.",
    "questions": [
        {"type": "predicate", "name": "is_urgent", "instructions": "Does this ticket convey urgency?"},
        {
            "type": "choice",
            "name": "department",
            "instructions": "Which team should handle this?",
            "choices": [
                {"value": "billing", "description": "Payments, refunds"},
                {"value": "technical", "description": "Bugs, outages"},
            ],
        },
    ],
    "extra": {"detail": "basic"},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--wait", type=float, default=0, help="seconds to wait for the server")
    parser.add_argument("--server-pid", type=int, help="stop waiting if this process exits")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}/v1/decisions"
    deadline = time.monotonic() + args.wait
    while True:
        try:
            response = httpx.post(url, json=SAMPLE, timeout=60)
            if response.status_code != 503 and response.status_code != 404:
                break
        except httpx.TransportError:
            pass
        if args.server_pid and not os.path.exists(f"/proc/{args.server_pid}"):
            print("the server exited before answering", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"no decision answer from {url} within {args.wait:.0f} s", file=sys.stderr)
            return 1
        time.sleep(1)
    print(json.dumps(response.json(), indent=2))
    return 0 if response.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
