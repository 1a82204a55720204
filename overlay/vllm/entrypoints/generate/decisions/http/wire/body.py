# SPDX-License-Identifier: Apache-2.0
"""Request bodies: JSON only, size-limited before the bytes are held, gzip / zstd decoded piece by piece
under the same limit, the bytes held at once bounded server-wide, and strict JSON. The TypeSafe SDK
zstd-compresses bodies over 1 KiB; decoding them needs ``backports.zstd`` (or Python 3.14), else 415.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import re
import sys
import threading
import zlib
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

import vllm.envs as envs
from vllm.entrypoints.generate.decisions.decide.errors import DecisionError, shown
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX

LIMIT_HINT = f"set {PREFIX}MAX_BODY_BYTES to raise it"
IN_FLIGHT_VARIABLE = PREFIX + "MAX_BODY_BYTES_IN_FLIGHT"
# Bodies at least this long are large: they are parsed on a thread of their own (decision_route.py)
# and may hold only LARGE_SHARE of the bytes in flight, so small requests are still taken meanwhile.
LARGE_BODY_BYTES = 64 * 1024
LARGE_SHARE = 0.75
# A compressed body is decoded this much of it at a time, so a bomb is caught within one piece's output.
DECODE_PIECE_BYTES = 64 * 1024
# A large body is freed this many objects (0.2 ms) at a time: freeing millions held the GIL for 30 ms.
FREED_PER_PIECE = 8192
NEVER = 1 << 30  # a collection threshold never reached
# While a large body is worked on, a thread waiting for the GIL gets it within this (Python's default is
# 5 ms, and a small request needs the GIL dozens of times; docs/reliability.md says why not sleep(0)).
SWITCH_SECONDS = 0.0005


class Decoder:
    """A body's ``Content-Encoding`` undone piece by piece, never past ``limit`` bytes (a bomb is
    refused as soon as it passes), each piece claimed before it is kept."""

    def __init__(self, encoding: str | None, limit: int) -> None:
        self.encoding = (encoding or "identity").strip().lower()
        self.limit = limit
        self.decompressor: Any = None
        if self.encoding == "gzip":
            self.decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif self.encoding == "zstd":
            # zlib's calls, from compression.zstd (Python 3.14) or backports.zstd
            for module_name in ("compression.zstd", "backports.zstd"):
                with contextlib.suppress(ImportError):
                    module = __import__(module_name, fromlist=["ZstdDecompressor"])
                    self.decompressor = module.ZstdDecompressor()
                    break
            if self.decompressor is None:
                raise DecisionError(
                    "zstd request bodies need the backports.zstd package on the server",
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                )
        elif self.encoding != "identity":
            raise DecisionError(
                f"Content-Encoding {shown(self.encoding)} is not supported (use gzip, zstd or none)",
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            )

    def decoded(self, raw: bytes, claim: Claim | None = None) -> bytes:
        decompressor = self.decompressor
        if decompressor is None:
            return raw
        parts: list[bytes] = []
        size = 0
        view = memoryview(raw)
        try:
            for start in range(0, len(raw), DECODE_PIECE_BYTES):
                if decompressor.eof:
                    break  # data after the end of the stream
                # never more than one byte past the limit, however far the piece would decode
                out = decompressor.decompress(
                    view[start : start + DECODE_PIECE_BYTES], self.limit + 1 - size
                )
                size += len(out)
                if size > self.limit:
                    raise DecisionError(
                        f"decoded request body is over the limit of {self.limit} bytes ({LIMIT_HINT})",
                        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    )
                if claim is not None:
                    claim.grow(len(out))
                parts.append(out)
            else:
                if decompressor.eof and not decompressor.unused_data:
                    return b"".join(parts)
        except DecisionError:
            raise
        except Exception:  # the decoder's own text says nothing a client can act on
            pass
        raise DecisionError(
            f"could not decode the {self.encoding} request body: it is not one complete, valid "
            f"{self.encoding} stream"
        )


def over_limit(size: int, limit: int) -> DecisionError:
    return DecisionError(
        f"request body of {size} bytes is over the limit of {limit} ({LIMIT_HINT})",
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    )


def decode_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """A body held whole (a bulk line), checked against ``limit`` before and after decoding."""
    if len(raw) > limit:
        raise over_limit(len(raw), limit)
    return Decoder(encoding, limit).decoded(raw)


class BodiesInFlight:
    """The body bytes one API-server process holds until answered, received or decoded: past ``limit``
    a request is refused (503), not queued. Decoding claims from the parsing thread, hence the lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.lock = threading.Lock()

    def claim(self) -> Claim:
        return Claim(self)

    def take(self, size: int, total: int) -> None:
        """``size`` more bytes for a body that will then hold ``total``; refused if they don't fit."""
        room = self.limit if total < LARGE_BODY_BYTES else int(self.limit * LARGE_SHARE)
        with self.lock:
            if self.held + size > room:
                raise ServerBusyError(
                    f"the server holds {self.held} bytes of request bodies, and this one's {size} more "
                    f"would pass its limit of {room} for bodies of this size ({IN_FLIGHT_VARIABLE} sets "
                    "it); retry shortly"
                )
            self.held += size

    def give(self, size: int) -> None:
        with self.lock:
            self.held -= size


class Claim:
    """One request's share of the bytes in flight; once released it takes nothing more (a parse its
    client left may still be finishing)."""

    def __init__(self, pool: BodiesInFlight) -> None:
        self.pool = pool
        self.size = 0
        self.released = False

    def grow(self, size: int) -> None:
        if size > 0 and not self.released:
            self.pool.take(size, self.size + size)
            self.size += size

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool.give(self.size)


class ServerBusyError(DecisionError):
    """Too many bytes of request bodies in flight: a temporary refusal."""

    retry_after = 1

    def __init__(self, message: str) -> None:
        super().__init__(message, HTTPStatus.SERVICE_UNAVAILABLE)


def media_type(request: Request) -> None:
    """Only JSON, as vLLM's routes: a form or text body is what a web page can send without a CORS
    preflight."""
    content_type = request.headers.get("content-type", "")
    kind = content_type.partition(";")[0].strip().lower()
    if kind != "application/json":
        shown = f"{content_type[:60]!r}" if content_type else "none"
        raise DecisionError(
            f"Content-Type {shown} is not accepted: send the body as JSON, with "
            "'Content-Type: application/json'",
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        )


async def read_body(request: Request, limit: int, claim: Claim) -> bytes:
    """The body as sent, each byte claimed before it is kept (the declared length up front)."""
    idle_timeout = envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    if (declared := request.headers.get("content-length")) is not None:
        if not declared.isdecimal():
            raise DecisionError(
                f"Content-Length {declared[:40]!r} is not a number of bytes"
            )
        if (size := int(declared)) > limit:
            raise over_limit(size, limit)
        claim.grow(size)
    parts: list[bytes] = []
    size = 0
    more = True
    while more:
        try:
            message = await asyncio.wait_for(request.receive(), idle_timeout)
        except TimeoutError:
            raise DecisionError(
                f"the request body stopped arriving for {idle_timeout:g} s (the server's idle timeout, "
                "VLLM_HTTP_TIMEOUT_KEEP_ALIVE)",
                HTTPStatus.REQUEST_TIMEOUT,
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise over_limit(size, limit)
        claim.grow(size - claim.size)
        parts.append(chunk)
    return b"".join(parts)


def parse_json(body: bytes) -> Any:
    """The body as JSON, strictly: UTF-8, no NaN or Infinity (they aren't JSON), no key twice in one
    object (a client's duplicate question ids would otherwise silently collapse into one)."""
    if not body.strip():
        raise DecisionError("the request body is empty; send a JSON object")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DecisionError(
            f"the request body is not valid UTF-8 (at byte {exc.start}); JSON must be UTF-8"
        ) from None
    try:
        parsed = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_not_json,
            parse_float=_finite,
        )
    except json.JSONDecodeError as exc:
        raise DecisionError(
            f"the request body is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    except RecursionError:
        raise DecisionError(
            "the request body's JSON is nested too deeply to parse"
        ) from None
    except ValueError:
        # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise DecisionError(
            f"the request body has a number of more than {sys.get_int_max_str_digits()} digits; no field takes one"
        ) from None
    # only \uD800-\uDFFF escapes can make text that isn't Unicode
    if SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(parsed)
    return parsed


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(value: Any) -> None:
    """A surrogate escape without its pair decodes to text no tokenizer can encode: refuse it here."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend([*item, *item.values()])
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise DecisionError(
                    f"the request body has a \\u{ord(item[exc.start]):04x} escape without its pair; "
                    "strings must be valid Unicode"
                ) from None


T = TypeVar("T")


def yielding_to_the_loop(work: Callable[[], T]) -> T:
    """``work`` (a large body parsed, validated and let go) with Python's full garbage collections put
    off, the GIL handed over every SWITCH_SECONDS, and each young collection a point to hand it over:
    its millions of new containers, none in a cycle, set off full collections that held the GIL for
    seconds, and C's parser builds empty arrays with no Python call (where a waiting thread can take
    the GIL) between them. Process-wide, restored after; young collections go on, on every thread."""
    young, middle, full = gc.get_threshold()  # one parse at a time (concurrency.py)
    interval = sys.getswitchinterval()
    gc.set_threshold(young, middle, NEVER)
    sys.setswitchinterval(min(interval, SWITCH_SECONDS))
    gc.callbacks.append(_hand_over)
    try:
        return work()
    finally:
        gc.callbacks.remove(_hand_over)
        sys.setswitchinterval(interval)
        gc.set_threshold(young, middle, full)


def _hand_over(phase: str, info: dict[str, int]) -> None:
    """Called at each collection: a Python call, where the interpreter gives the GIL to a waiter."""


def let_go(parsed: Any) -> None:
    """Free a parsed body FREED_PER_PIECE objects at a time, changing nothing: a piece's children are
    held before it is dropped, so what the validated request keeps stays whole. Pass the only
    reference (``held.pop()``)."""
    held = [parsed]
    del parsed
    while held:
        piece = held[-FREED_PER_PIECE:]
        del held[-FREED_PER_PIECE:]
        for item in piece:
            if isinstance(item, dict):
                held.extend(item.values())
            elif isinstance(item, list):
                held.extend(item)
        del piece


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)  # in C: a body of many small objects is parsed at C's pace
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DecisionError(
                    f"key {shown(key)} appears twice in one JSON object of the request body"
                )
            seen.add(key)
    return result


def _finite(text: str) -> float:
    """A JSON number as a float, refused when it is too large for one (``1e999`` would read as infinity)."""
    value = float(text)
    if math.isinf(value):
        raise DecisionError(
            f"the number {text[:40]} in the request body is too large for a 64-bit float"
        )
    return value


def _not_json(constant: str) -> Any:
    raise DecisionError(
        f"{constant} is not a JSON number; the request body must be standard JSON"
    )
