"""How long the event loop waits for the GIL while the parsing thread works on a large body (issue 50).

The parsing thread parses, validates and frees bodies just under the 4 MiB limit as the server does
(``http/wire/body.py``: ``yielding_to_the_loop`` around ``parse_json``, ``let_go``), while this thread
sleeps 1 ms at a time and counts how late each wake-up is. Baseline, in the same run: the same work
with the collection hand-over taken out (``_hand_over`` removed from ``gc.callbacks``).

usage: python -m tools.bench.parse_handover [--seconds 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import threading
import time

from tools.bench.byte_attacks import LIMIT, padded_jev
from vllm.entrypoints.generate.decisions.http.wire import body


def parse_and_let_go(raw: bytes, hand_over: bool) -> None:
    if not hand_over:
        gc.callbacks.remove(body._hand_over)
    try:
        held = [body.parse_json(raw)]
        body.let_go(held.pop())
    finally:
        if not hand_over:
            gc.callbacks.append(body._hand_over)


def lateness(raw: bytes, hand_over: bool, seconds: float) -> list[float]:
    """Each 1 ms sleep's lateness on this thread while another parses ``raw`` over and over."""
    done = threading.Event()

    def parser() -> None:
        while not done.is_set():
            body.yielding_to_the_loop(lambda: parse_and_let_go(raw, hand_over))

    thread = threading.Thread(target=parser)
    thread.start()
    late = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
    done.set()
    thread.join()
    return sorted(late)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    objects = padded_jev(LIMIT - 1024)
    for name, raw in (("objects", objects), ("arrays", objects.replace(b"{}", b"[]"))):
        for _ in range(args.rounds):
            for hand_over in (False, True):
                late = lateness(raw, hand_over, args.seconds)
                p99 = late[min(len(late) - 1, int(len(late) * 0.99))]
                print(
                    f"{name}, hand-over {'on ' if hand_over else 'off'}: {len(late)} wake-ups, "
                    f"late p50 {late[len(late) // 2] * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, "
                    f"max {late[-1] * 1e3:.2f} ms"
                )


if __name__ == "__main__":
    main()
