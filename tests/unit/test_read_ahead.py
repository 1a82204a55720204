"""run-batch's read-ahead: lines about one input come out together within the window, and the window
bounds how many lines are held; a budget bounds their text, read ahead and in flight."""

from __future__ import annotations

import asyncio
import json

from vllm.entrypoints.generate.decisions.bulk.run_batch import InFlight, Line, ReadAhead

UNBOUNDED = 1 << 40  # a budget no test line reaches


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
        inputs[line.number - 1] for line in ReadAhead(parsed(inputs), window, UNBOUNDED)
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
    reader = ReadAhead(lines, window=7, budget=UNBOUNDED)
    out = []
    for line in reader:
        assert reader.held < 7  # the one handed out is no longer held
        out.append(line.number)
    assert sorted(out) == [line.number for line in lines]


def sized(*sizes: int) -> list[Line]:
    """Lines of these many characters (not requests: they group as one, in file order)."""
    return [Line(n, "x" * size, None, "not json") for n, size in enumerate(sizes, 1)]


def test_the_budget_bounds_the_text_read_ahead():
    lines = sized(*[100] * 6, 1000, *[100] * 6, *[30] * 20)
    held_at_read = []

    def source():
        for line in lines:
            held_at_read.append(reader.held_size)
            yield line

    reader = ReadAhead(source(), window=1000, budget=250)
    peak = 0
    for line in reader:
        peak = max(peak, reader.held_size + line.size)  # held once the last fill ended
    assert len(held_at_read) == len(lines)
    # It reads on only while it holds less than the budget, so it holds at most that plus the last
    # line read: three lines of 100, or two of them and the line of 1000.
    assert max(held_at_read) < 250 and peak == 200 + 1000
    # A budget below every line's size still hands out every line, one held at a time.
    reader = ReadAhead(sized(300, 300, 300), window=1000, budget=1)
    assert [line.number for line in reader] == [1, 2, 3] and reader.held_size == 0


async def test_in_flight_bounds_the_lines_and_their_text():
    gate = InFlight(lines=3, budget=250)
    seen = []

    async def answer(size: int) -> None:
        await asyncio.sleep(0.001)
        gate.leave(size)

    tasks = []
    for line in sized(100, 100, 100, 1000, *[30] * 8):
        await gate.enter(line.size)
        seen.append((gate.count, gate.size))
        tasks.append(asyncio.create_task(answer(line.size)))
    await asyncio.gather(*tasks)
    assert (gate.count, gate.size) == (0, 0)
    assert max(count for count, _ in seen) == 3
    # over the budget only a line larger than it, alone
    assert all(size <= 250 or count == 1 for count, size in seen) and (1, 1000) in seen
