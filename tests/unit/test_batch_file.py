"""Batch files: what an earlier run answered (resume), with a cut-short last line and a foreign file."""

from __future__ import annotations

import json

import pytest

from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    Done,
    lines,
    output_line,
    resume,
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
