from __future__ import annotations

import gzip
from http import HTTPStatus

import pytest
from backports import zstd

from vllm.entrypoints.generate.decisions.body import decode_body
from vllm.entrypoints.generate.decisions.errors import DecisionError

BODY = b'{"state": "' + b"x" * 5000 + b'"}'


@pytest.mark.parametrize(("encoding", "data"), [(None, BODY), ("gzip", gzip.compress(BODY)), ("zstd", zstd.compress(BODY)),
                                                ("ZSTD ", zstd.compress(BODY)), ("identity", BODY)])  # fmt: skip
def test_decodes(encoding, data):
    assert decode_body(data, encoding, 1 << 20) == BODY


@pytest.mark.parametrize(
    ("encoding", "data", "status", "needle"),
    [
        ("br", BODY, HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "'br' is not supported"),
        ("gzip", BODY, HTTPStatus.BAD_REQUEST, "could not decode the gzip"),
        ("zstd", zstd.compress(BODY)[:-8], HTTPStatus.BAD_REQUEST, "could not decode the zstd"),
        ("gzip", gzip.compress(BODY)[:-12], HTTPStatus.BAD_REQUEST, "could not decode the gzip"),
        (None, BODY, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES"),
        ("zstd", zstd.compress(BODY * 100), HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES"),
        ("gzip", gzip.compress(BODY * 100), HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES"),
    ],
)
def test_refuses(encoding, data, status, needle):
    limit = 4096 if data is BODY and encoding is None else 1 << 16
    with pytest.raises(DecisionError, match=needle) as caught:
        decode_body(data, encoding, limit)
    assert caught.value.status == status
