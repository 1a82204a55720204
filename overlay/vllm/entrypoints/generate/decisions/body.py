# SPDX-License-Identifier: Apache-2.0
"""Request bodies: a size limit, and ``Content-Encoding: gzip`` / ``zstd`` decoding.

The TypeSafe SDK compresses bodies over 1 KiB with zstd when its ``zstd`` extra is installed.
zstd decoding needs ``backports.zstd`` or ``zstandard`` in the server's environment (Python 3.14's
``compression.zstd`` also works); without one, such a body gets a 415 that says so.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from .errors import DecisionError
from .settings import PREFIX

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
        raise DecisionError(f"request body of {len(raw)} bytes is over the limit of {limit} ({LIMIT_HINT})",
                            HTTPStatus.REQUEST_ENTITY_TOO_LARGE)  # fmt: skip
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
    except Exception as exc:
        raise DecisionError(f"could not decode the {encoding} request body: {exc}") from None
    if len(body) > limit:
        raise DecisionError(f"decoded request body is over the limit of {limit} bytes ({LIMIT_HINT})",
                            HTTPStatus.REQUEST_ENTITY_TOO_LARGE)  # fmt: skip
    return body
