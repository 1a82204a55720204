"""Hostile clients' bytes against a running server (issue 50): for each attack, what it costs the API
server's memory per byte the server accepted, and another client's one-question decision latency
while it runs, beside that client's latency with no attack measured in the same run.

Each attack runs from ``clients`` threads at once, each repeating it until the victim's requests are
done. The victim sends one-question decisions one after another over a kept-alive connection.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx
import psutil

# The server's default body limit (VLLM_TYPED_DECISIONS_MAX_BODY_BYTES).
LIMIT = 4 * 1024 * 1024


def padded_jev(size: int) -> bytes:
    """Legal Jev fields plus an unknown top-level list of empty objects, ``size`` bytes in all: the
    body that parses to the most Python objects per byte."""
    head = (
        b'{"state":"x","questions":{"q":{"type":"noul","instructions":"?"}},"padding":['
    )
    count = (size - len(head) - 4) // 3
    return head + b"{}," * count + b"{}]}"


@dataclass
class Tally:
    """What the attackers sent and what the server did with it."""

    accepted: int = 0  # decoded body bytes the server read
    sent: int = 0  # bytes on the wire
    statuses: dict[int | str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, status: int | str, sent: int, accepted: int) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.sent += sent
            self.accepted += accepted


def post_raw(
    port: int,
    path: str,
    body: bytes,
    headers: dict[str, str],
    read_reply: bool = True,
) -> int | str:
    """POST ``body`` over a fresh socket; the status, or 'left' when not read (the client hangs up)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        f"{head}\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        try:
            sock.sendall(request)
        except OSError:
            return "reset"
        if not read_reply:
            return "left"
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                return "closed"
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@dataclass
class Attack:
    """One hostile client's request: its path, body and headers; whether it waits for the answer."""

    name: str
    body: bytes
    headers: dict[str, str]
    decoded: int
    read_reply: bool = True
    path: str = "/v1/systemone"
    pause: float = 0.0  # seconds each client waits between requests

    def once(self, port: int, key: dict[str, str], tally: Tally) -> None:
        status = post_raw(
            port, self.path, self.body, {**key, **self.headers}, self.read_reply
        )
        # bytes the server read: all of them unless it refused before reading (413, 415, 503) or the
        # client left (what it read of those is not known here)
        read = status not in (401, 413, 415, 503, "left", "reset", "closed")
        tally.add(status, len(self.body), self.decoded if read else 0)


def attacks() -> list[Attack]:
    plain = padded_jev(LIMIT - 1024)
    packed = gzip.compress(plain, 9)
    # arrays are parsed in C without a hook, and are containers the garbage collector follows
    arrays = plain.replace(b"{}", b"[]")
    json_type = {"Content-Type": "application/json"}
    small = json.dumps({"state": "x", "questions": {"q": {"type": "no-such-type"}}})
    answered = json.dumps(
        {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}},
        separators=(",", ":"),
    ).encode()
    decisions = Attack(
        "small decisions answered (the floor for answered bodies: the engine is shared)",
        answered,
        json_type,
        len(answered),
    )
    return [
        Attack(
            "small bodies refused once parsed (the floor: requests, not bytes)",
            small.encode(),
            json_type,
            len(small),
        ),
        decisions,
        replace(
            decisions,
            name="small decisions answered, each client one every 2 s (about as many a second "
            "as bodies of empty arrays at the limit get answered: the engine's share alone)",
            pause=2.0,
        ),
        Attack(
            "gzip bodies decoding to just under the limit (empty objects)",
            packed,
            {**json_type, "Content-Encoding": "gzip"},
            len(plain),
        ),
        Attack("plain bodies just under the limit", plain, json_type, len(plain)),
        Attack(
            "plain bodies just under the limit, empty arrays",
            arrays,
            json_type,
            len(arrays),
        ),
        Attack(
            "plain bodies just under the limit, the client hangs up",
            plain,
            json_type,
            len(plain),
            read_reply=False,
        ),
        Attack(
            "gzip bodies decoding past the limit",
            gzip.compress(padded_jev(6 * LIMIT), 9),
            {**json_type, "Content-Encoding": "gzip"},
            LIMIT,
        ),
        Attack(
            "form posts (what a web page sends without a preflight)",
            json.dumps({"state": "x", "questions": {"q": {"type": "noul"}}}).encode(),
            {
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": "http://evil.example",
            },
            0,
        ),
    ]


def victim_latencies(url: str, key: dict[str, str], count: int) -> list[float]:
    body = {
        "state": "The parcel is late.",
        "questions": {"late": {"type": "noul", "instructions": "Is it late?"}},
    }
    seconds = []
    with httpx.Client(base_url=url, headers=key, timeout=300) as client:
        for _ in range(count):
            started = time.perf_counter()
            response = client.post("/v1/systemone", json=body)
            seconds.append(time.perf_counter() - started)
            response.raise_for_status()
    return seconds


def victim_apart(url: str, key: dict[str, str], count: int) -> list[float]:
    """:func:`victim_latencies` in a process of its own: the attackers' threads here would otherwise make
    the victim wait for this process's GIL, and the figures would be the bench's, not the server's."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(victim_latencies, (url, key, count))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def under_attack(
    url: str,
    pid: int,
    key: dict[str, str],
    attack: Attack,
    clients: int,
    victims: int,
) -> tuple[list[float], int, Tally]:
    """The victim's latencies while ``clients`` threads repeat ``attack``, the API server's peak RSS
    growth over its RSS before, and what the attackers' requests came to."""
    port = int(url.rsplit(":", 1)[1])
    tally = Tally()
    done = threading.Event()
    before = rss(pid)
    peak = before

    def attacker() -> None:
        while not done.is_set():
            try:
                attack.once(port, key, tally)
            except OSError as exc:
                tally.add(type(exc).__name__, 0, 0)
            done.wait(attack.pause)

    def sampler() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss(pid))
            time.sleep(0.02)

    threads = [threading.Thread(target=attacker) for _ in range(clients)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the attack under way before the victim starts
    try:
        latencies = victim_apart(url, key, victims)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    return latencies, peak - before, tally


def stalled_connections(port: int, count: int, wait: float) -> int:
    """How many of ``count`` connections that sent half a request head are still open after ``wait``
    seconds."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        sockets.append(sock)
    time.sleep(wait)
    still_open = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            still_open += sock.recv(1) != b""
        except BlockingIOError:
            still_open += 1
        except OSError:
            pass
        sock.close()
    return still_open


def run(
    url: str,
    pid: int,
    key: dict[str, str],
    clients: int,
    victims: int,
    print_line: Callable[[str], None] = print,
) -> None:
    victim_latencies(url, key, 5)  # warm
    baseline = victim_apart(url, key, victims)
    base_p50, base_p99 = statistics.median(baseline), p99(baseline)
    print_line(
        f"baseline: one-question decision p50 {base_p50 * 1000:.0f} ms, p99 {base_p99 * 1000:.0f} ms "
        f"({victims} requests)"
    )
    for attack in attacks():
        latencies, growth, tally = under_attack(url, pid, key, attack, clients, victims)
        per_byte = growth / tally.accepted if tally.accepted else float("nan")
        seconds = sum(latencies) + 1.0
        print_line(
            f"{attack.name}, {clients} clients, {len(attack.body):,} bytes each "
            f"({tally.sent / seconds / 2**20:,.0f} MiB/s sent): "
            f"{sum(tally.statuses.values())} sent, statuses {dict(sorted(tally.statuses.items(), key=str))}; "
            f"RSS +{growth / 2**20:.0f} MiB for {tally.accepted / 2**20:.0f} MiB accepted "
            f"({per_byte:.2f}x); victim p50 {statistics.median(latencies) * 1000:.0f} ms "
            f"({statistics.median(latencies) / base_p50:.2f}x), p99 {p99(latencies) * 1000:.0f} ms "
            f"({p99(latencies) / base_p99:.2f}x)"
        )
    port = int(url.rsplit(":", 1)[1])
    started = time.perf_counter()
    status = post_raw_declared(port, key)
    print_line(
        f"Content-Length 100,000,000 with 28 bytes sent: {status} in "
        f"{time.perf_counter() - started:.2f} s"
    )
    long_id = httpx.post(
        f"{url}/v1/systemone",
        json={"state": "x", "questions": {"q": {"type": "noul"}}},
        headers={**key, "X-Request-Id": "r" * 2_000_000},
        timeout=60,
    )
    echoed = len(long_id.content) + sum(map(len, long_id.headers.values()))
    print_line(
        f"a 2 MB X-Request-Id: {long_id.status_code}, {echoed:,} bytes of body and headers"
    )
    print_line(
        f"120 connections that sent half a request head: {stalled_connections(port, 120, 12)} "
        "still open after 12 s"
    )
    # every claim was given back: a body at the limit is read again, not refused as busy
    after = Tally()
    at_limit = next(
        a for a in attacks() if a.name.startswith("gzip bodies decoding to")
    )
    at_limit.once(port, key, after)
    print_line(f"after the attacks, a body just under the limit: {after.statuses}")


def post_raw_declared(port: int, key: dict[str, str]) -> int | str:
    """A body that says it is 100 MB and sends 28 bytes: the status, as soon as one comes."""
    head = "".join(f"{k}: {v}\r\n" for k, v in key.items())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            (
                "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: 100000000\r\n{head}\r\n"
            ).encode()
            + b'{"state": "x", "questions":'
        )
        reply = sock.recv(4096)
    return int(reply.split(b" ", 2)[1]) if reply else "closed"
