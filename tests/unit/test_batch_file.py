"""Batch files: what an earlier run answered (resume), with a cut-short last line and a foreign file;
lines split at \\n only, and a line over the size limit read past, not into memory."""

from __future__ import annotations

import contextlib
import json

import pytest

from vllm.entrypoints.generate.decisions.bulk import batch_file
from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    Done,
    TooLong,
    lines,
    output_line,
    resume,
    too_long,
)


def test_done_keeps_only_the_lines_past_the_first_gap():
    done = Done()
    for line in (1, 2, 4, 5, 3, 9):
        done.add(line)
    assert done.below == 6 and done.beyond == {9} and len(done) == 6
    assert (
        all(n in done for n in (1, 2, 3, 4, 5, 9)) and 6 not in done and 10 not in done
    )


def test_resume_drops_a_line_cut_short_by_a_kill(tmp_path):
    out = tmp_path / "out.jsonl"
    written = output_line(1, "a", "x", 200, {"ok": True}, None) + output_line(
        3, "b", "y", 400, {}, None
    )
    out.write_text(written + output_line(2, "c", "z", 200, {}, None)[:25])
    done = resume(out)
    assert 1 in done and 3 in done and 2 not in done
    # the partial line is gone; the rerun answers line 2 again
    assert out.read_text() == written


def test_resume_refuses_an_output_file_it_did_not_write(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "vllm-123", "custom_id": "x"}) + "\n")
    with pytest.raises(ValueError, match="not written by a decision batch"):
        resume(out)
    assert len(resume(tmp_path / "missing.jsonl")) == 0


def test_lines_are_numbered_from_one_and_blank_ones_skipped(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n\n{"b": 2}\n')
    assert [n for n, _ in lines(source)] == [1, 3]


def test_lines_end_at_newline_only(tmp_path):
    """A bare \\r is JSON whitespace inside a line (universal newlines made it two); \\r\\n still ends one."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"a":\r 1,\r"s": "x"}\n{"b": 2}\r\n\r\n{"c": 3}')
    read = list(lines(source))
    assert read == [(1, '{"a":\r 1,\r"s": "x"}'), (2, '{"b": 2}\r'), (4, '{"c": 3}')]
    assert [json.loads(text) for _, text in read] == [
        {"a": 1, "s": "x"},
        {"b": 2},
        {"c": 3},
    ]


class Watched:
    """A path whose file records the longest read, and refuses a read without a bound."""

    def __init__(self, path):
        self.path, self.longest = path, 0

    @contextlib.contextmanager
    def open(self, mode):
        with self.path.open(mode) as f:
            watched = self

            class Reader:
                def readline(self, size):
                    assert size >= 0, "a read without a bound"
                    data = f.readline(size)
                    watched.longest = max(watched.longest, len(data))
                    return data

            yield Reader()


def test_a_line_over_the_limit_is_read_past_in_bounded_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_file, "SKIP_CHUNK", 4096)
    source = tmp_path / "in.jsonl"
    lines_in = [
        b'{"a": 1}',
        b"x" * 100_000,  # over
        b"y" * 64,  # just at the limit
        b"z" * 65,  # just over
        b'{"b": 2}',
        b"w" * 65,  # over, and the last line, with no \\n
    ]
    source.write_bytes(b"\n".join(lines_in))
    watched = Watched(source)
    read = list(lines(watched, limit=64))  # type: ignore[arg-type]
    assert read == [
        (1, '{"a": 1}'),
        (2, TooLong(100_000)),
        (3, "y" * 64),
        (4, TooLong(65)),
        (5, '{"b": 2}'),
        (6, TooLong(65)),
    ]
    assert watched.longest <= 4096
    message = too_long(2, 100_000, 64)
    assert message.startswith("line 2: 100000 bytes, over the limit of 64")
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in message
