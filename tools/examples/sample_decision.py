"""Send the README's sample decision to a running server and print the answers.

Waits (up to --wait seconds) while the server is starting: decision requests answer 503 until the
decision startup work is done, so this polls a decision request rather than /health. It polls as the
503's Retry-After says (5 to 15 s; vLLM's access log prints a line per poll) and prints what the server
is doing (e.g. "calibration, 120 of 300 questions read, about 40 s left") only when it changes. A 503
without Retry-After means startup failed: waiting won't help, so the reason is printed at once.
The decision names the served model as ``GET /v1/models`` lists it first (or --model): a name the server
doesn't serve is refused 404, as vLLM refuses it. A server started with ``--api-key`` gets the key from
--api-key or ``VLLM_API_KEY`` (as ``vllm serve`` reads it); one that refuses it ends the wait at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import httpx

SAMPLE = {
    "model": "",  # the served model's name, from GET /v1/models
    "input": "Ticket: My payouts have been failing for 3 days and I need the money today.",
    "questions": [
        {
            "type": "predicate",
            "name": "is_urgent",
            "instructions": "Does this ticket convey urgency?",
        },
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


POLL_S = 5.0  # between polls while the server gives no Retry-After (not up yet: connection refused, 404)
MAX_POLL_S = 30.0


def starting_message(response: httpx.Response) -> str:
    """What a starting server's 503 says it is doing (vLLM's OpenAI error shape: ``{"error": {"message"}}``)."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return response.text.strip()[:300]
    return str(error.get("message", "")) if isinstance(error, dict) else ""


def retry_after(response: httpx.Response | None) -> float:
    """The seconds the server asked to wait (Retry-After), else the default pace."""
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return min(max(float(value), 1.0), MAX_POLL_S) if value else POLL_S
    except ValueError:
        return POLL_S


def served_model(port: int, headers: dict[str, str]) -> str:
    """The first model the server lists (its served model name)."""
    response = httpx.get(
        f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=30
    )
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--wait", type=float, default=0, help="seconds to wait for the server"
    )
    parser.add_argument(
        "--server-pid", type=int, help="stop waiting if this process exits"
    )
    parser.add_argument(
        "--model", help="the model to ask (default: the first GET /v1/models lists)"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="the server's key, if it has one (default: VLLM_API_KEY)",
    )
    args = parser.parse_args()
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = f"http://127.0.0.1:{args.port}/v1/decisions"
    deadline = time.monotonic() + args.wait
    said = ""
    while True:
        response: httpx.Response | None = None
        try:
            model = args.model or served_model(args.port, headers)
            sample = {**SAMPLE, "model": model}
            response = httpx.post(url, json=sample, headers=headers, timeout=60)
            if response.status_code not in (503, 404):
                break
            if response.status_code == 503 and "retry-after" not in response.headers:
                break  # startup failed: waiting won't help, the body says why
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in (401, 403):
                print(
                    f"the server refused the API key ({exc.response.status_code}): give "
                    "its key with --api-key or VLLM_API_KEY",
                    file=sys.stderr,
                )
                return 1
        except (httpx.TransportError, ValueError, KeyError, IndexError):  # not up yet
            pass
        if response is not None and response.status_code == 503:
            message = starting_message(response)
            if message and message != said:
                print(f"waiting: {message}", file=sys.stderr, flush=True)
                said = message
        if args.server_pid and not os.path.exists(f"/proc/{args.server_pid}"):
            print("the server exited before answering", file=sys.stderr)
            return 1
        left = deadline - time.monotonic()
        if left <= 0:
            print(
                f"no decision answer from {url} within {args.wait:.0f} s",
                file=sys.stderr,
            )
            return 1
        pause = min(retry_after(response), left)
        while pause > 0:  # in steps, so a server that exits is noticed soon
            time.sleep(min(pause, 1.0))
            pause -= 1.0
            if args.server_pid and not os.path.exists(f"/proc/{args.server_pid}"):
                break
    assert response is not None
    print(json.dumps(response.json(), indent=2))
    return 0 if response.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
