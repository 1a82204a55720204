"""run-batch's read-ahead: lines about one input come out together within the window, and the window
bounds how many lines are held."""

from __future__ import annotations

import json

from vllm.entrypoints.generate.decisions.bulk.run_batch import Line, ReadAhead


def parsed(inputs: str) -> list[Line]:
    """A line per letter, the letter being its input (a /v1/decisions line) or, for "?", not JSON."""
    lines = []
    for number, name in enumerate(inputs, 1):
        record = {
            "custom_id": str(number),
            "url": "/v1/decisions",
            "body": {"input": name, "questions": []},
        }
        lines.append(Line.parse(number, "{" if name == "?" else json.dumps(record)))
    return lines


def order(inputs: str, window: int) -> str:
    return "".join(
        inputs[line.number - 1] for line in ReadAhead(parsed(inputs), window)
    )


def test_lines_about_one_input_come_out_together_first_appearance_first():
    assert order("abcabcab", window=100) == "aaabbbcc"
    # lines that are not requests group as one
    assert order("ab?ba?", window=100) == "aabb??"


def test_the_window_bounds_how_far_ahead_lines_are_grouped():
    # Window 3: "a" at 1 is held with b, c; the "a" at 4 isn't read yet when the first one leaves.
    assert order("abca", window=3) == "abca"
    assert order("abca", window=4) == "aabc"
    # A line read while its input's group is still being handed out joins it.
    assert order("aab" + "a", window=3) == "aaab"


def test_every_line_comes_out_once_and_at_most_window_are_held():
    lines = parsed("abcdeabcdeaaaa" * 20)
    reader = ReadAhead(lines, window=7)
    out = []
    for line in reader:
        assert reader.held < 7  # the one handed out is no longer held
        out.append(line.number)
    assert sorted(out) == [line.number for line in lines]
