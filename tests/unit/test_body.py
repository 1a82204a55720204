from __future__ import annotations

import gc
import gzip
import json
import sys
import weakref
from http import HTTPStatus

import pytest
from backports import zstd

from vllm.entrypoints.generate.decisions.decide.errors import DecisionError
from vllm.entrypoints.generate.decisions.http.wire import body
from vllm.entrypoints.generate.decisions.http.wire.body import (
    decode_body,
    let_go,
    parse_json,
    yielding_to_the_loop,
)

BODY = b'{"state": "' + b"x" * 5000 + b'"}'


@pytest.mark.parametrize(
    ("encoding", "data"),
    [
        (None, BODY),
        ("gzip", gzip.compress(BODY, mtime=0)),
        ("zstd", zstd.compress(BODY)),
        ("ZSTD ", zstd.compress(BODY)),
        ("identity", BODY),
    ],
)
def test_decodes(encoding, data):
    assert decode_body(data, encoding, 1 << 20) == BODY


@pytest.mark.parametrize(
    ("encoding", "data", "status", "needle"),
    [
        ("br", BODY, HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "'br' is not supported"),
        ("gzip", BODY, HTTPStatus.BAD_REQUEST, "could not decode the gzip"),
        (
            "zstd",
            zstd.compress(BODY)[:-8],
            HTTPStatus.BAD_REQUEST,
            "could not decode the zstd",
        ),
        (
            "gzip",
            gzip.compress(BODY, mtime=0)[:-12],
            HTTPStatus.BAD_REQUEST,
            "could not decode the gzip",
        ),
        (
            None,
            BODY,
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES",
        ),
        (
            "zstd",
            zstd.compress(BODY * 100),
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES",
        ),
        (
            "gzip",
            gzip.compress(BODY * 100, mtime=0),
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES",
        ),
    ],
)
def test_refuses(encoding, data, status, needle):
    limit = 4096 if data is BODY and encoding is None else 1 << 16
    with pytest.raises(DecisionError, match=needle) as caught:
        decode_body(data, encoding, limit)
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b'{"state": "\xff\xfe"}', "not valid UTF-8 (at byte 11)"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"questions": {"q": 1, "q": 2}}', "key 'q' appears twice"),
        (b'{"a": 1,}', "not valid JSON (line 1, column 9)"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"state": "a \\ud800 b"}', "\\ud800 escape without its pair"),
        (b'{"q": {"\\udfff": 1}}', "\\udfff escape without its pair"),
        # json reads these through int() and float(): one raised ValueError past the parser (a 500 over
        # HTTP, a dead run-batch), the other read as infinity.
        (b'{"seed": ' + b"9" * 5000 + b"}", "a number of more than 4300 digits"),
        (
            b'{"extra": {"calibration_temperature": 1e999}}',
            "1e999 in the request body is too large",
        ),
        (b"[-1E+400]", "-1E+400 in the request body is too large"),
    ],
)
def test_strict_json_refusals(body, needle):
    with pytest.raises(DecisionError) as caught:
        parse_json(body)
    assert (
        needle in caught.value.message and caught.value.status == HTTPStatus.BAD_REQUEST
    )


def test_strict_json_accepts_json():
    assert parse_json(b'["\\ud83d\\ude00"]') == [
        "\U0001f600"
    ]  # a surrogate pair is one character
    assert parse_json('\ufeff{"s": "é ✨", "n": [1, 2.5e3, null, true]}'.encode()) == {
        "s": "é ✨",
        "n": [1, 2500.0, None, True],
    }


class Traced(dict):
    """A JSON object that can be watched being freed."""


def test_let_go_frees_everything_and_keeps_what_the_request_holds():
    parsed = json.loads(
        json.dumps(
            {
                "kept": {"messages": [{"role": "user", "content": "hi"}]},
                "padding": [[{}, {"a": [1]}]] * 10_000,
            }
        )
    )
    traced = Traced(deep=[1, 2])
    parsed["padding"][-1][1]["a"].append(traced)
    watch = weakref.ref(traced)
    del traced
    kept, inner = parsed["kept"], parsed["padding"][1234]
    held = [parsed]
    del parsed
    let_go(held.pop())
    assert watch() is None  # freed, deep as it was
    # what something else holds (here the test, in the server the validated request) is untouched
    assert kept == {"messages": [{"role": "user", "content": "hi"}]}
    assert inner == [{}, {"a": [1]}]


def test_full_collections_put_off_switch_shortened_and_hand_over_added_while_the_work_runs():
    def settings() -> tuple:
        return (
            gc.get_threshold(),
            sys.getswitchinterval(),
            gc.callbacks.count(body._hand_over),
        )

    was = settings()
    try:
        gc.set_threshold(700, 10, 10)
        sys.setswitchinterval(0.005)
        assert yielding_to_the_loop(settings) == (
            (700, 10, body.NEVER),
            pytest.approx(body.SWITCH_SECONDS),
            1,
        )
        assert settings() == ((700, 10, 10), pytest.approx(0.005), 0)

        def fails() -> None:
            raise ValueError("bad body")

        with pytest.raises(ValueError):
            yielding_to_the_loop(fails)
        assert settings() == ((700, 10, 10), pytest.approx(0.005), 0)
    finally:
        gc.set_threshold(*was[0])
        sys.setswitchinterval(was[1])
