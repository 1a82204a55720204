# SPDX-License-Identifier: Apache-2.0
"""Request bodies: a size limit, ``Content-Encoding: gzip`` / ``zstd`` decoding, and strict JSON.

The TypeSafe SDK compresses bodies over 1 KiB with zstd when its ``zstd`` extra is installed.
zstd decoding needs ``backports.zstd`` or ``zstandard`` in the server's environment (Python 3.14's
``compression.zstd`` also works); without one, such a body gets a 415 that says so.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
import zlib
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.decide.settings import PREFIX

LIMIT_HINT = f"set {PREFIX}MAX_BODY_BYTES to raise it"


def _zstd_decoder() -> Callable[[bytes, int], bytes] | None:
    """A bounded zstd decompressor from whichever zstd module is installed."""
    for module_name in ("compression.zstd", "backports.zstd"):
        try:
            module: Any = __import__(module_name, fromlist=["ZstdDecompressor"])
        except ImportError:
            continue

        def stdlib_style(data: bytes, limit: int, module: Any = module) -> bytes:
            decompressor = module.ZstdDecompressor()
            out = decompressor.decompress(data, max_length=limit + 1)
            if not decompressor.eof and len(out) <= limit:
                raise ValueError("truncated zstd frame")
            return out

        return stdlib_style
    try:
        import zstandard
    except ImportError:
        return None

    def zstandard_style(data: bytes, limit: int) -> bytes:
        reader = zstandard.ZstdDecompressor().stream_reader(data)
        return reader.read(limit + 1)

    return zstandard_style


ZSTD = _zstd_decoder()


def _gzip(data: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = decompressor.decompress(data, limit + 1)
    if not decompressor.eof and len(out) <= limit:
        raise gzip.BadGzipFile("truncated gzip stream")
    return out


def decode_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """The body as JSON bytes: checked against ``limit`` before and after decoding."""
    if len(raw) > limit:
        raise DecisionError(
            f"request body of {len(raw)} bytes is over the limit of {limit} ({LIMIT_HINT})",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return raw
    decoders = {"gzip": _gzip, "zstd": ZSTD}
    decode = decoders.get(encoding)
    if encoding == "zstd" and decode is None:
        raise DecisionError(
            "zstd request bodies need the backports.zstd or zstandard package on the server",
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        )
    if decode is None:
        raise DecisionError(
            f"Content-Encoding {encoding!r} is not supported (use gzip, zstd or none)",
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        )
    try:
        body = decode(raw, limit)
    except Exception:  # the decoder's own text says nothing a client can act on
        raise DecisionError(
            f"could not decode the {encoding} request body: it is not a complete, valid {encoding} stream"
        ) from None
    if len(body) > limit:
        raise DecisionError(
            f"decoded request body is over the limit of {limit} bytes ({LIMIT_HINT})",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    return body


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
            stack.extend(item.keys())
            stack.extend(item.values())
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


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DecisionError(
                f"key {key!r} appears twice in one JSON object of the request body"
            )
        result[key] = value
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
