# SPDX-License-Identifier: Apache-2.0
"""Batch files as ``vllm run-batch`` reads and writes them (OpenAI's batch format), streamed and resumable.

Input: one ``{"custom_id", "method", "url", "body"}`` per line. Output: one
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` per line, written
as each answer arrives, so a crash loses no finished line. Each output ``id`` names the input line it
answers (``batch-L<line>-...``): a rerun with the same files skips the lines already written, keeping
only a bounded set of line numbers in memory (all lines below the first gap, plus the few answered
out of order after it). Lines end at ``\\n`` only: a ``\\r`` is JSON whitespace, inside a line or
before its ``\\n``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from vllm.entrypoints.generate.decisions.decide.settings import PREFIX

LINE_ID = re.compile(r"^batch-L(\d+)-")
# How much of a line over the size limit is read at a time, on the way to its end.
SKIP_CHUNK = 1 << 20


@dataclass
class Done:
    """The input lines an earlier run already answered: every line below ``below``, and ``beyond``;
    ``failed``: how many of them were answered with an error (the run's exit status counts them too)."""

    below: int = 1
    beyond: set[int] = field(default_factory=set)
    failed: int = 0

    def add(self, line: int) -> None:
        self.beyond.add(line)
        while self.below in self.beyond:
            self.beyond.remove(self.below)
            self.below += 1

    def __contains__(self, line: int) -> bool:
        return line < self.below or line in self.beyond

    def __len__(self) -> int:
        return self.below - 1 + len(self.beyond)


def resume(output: Path) -> Done:
    """The lines ``output`` already answers. A last line cut short (a killed run) is removed from the
    file, so that line is answered again; any other line that isn't ours is refused, not overwritten."""
    done = Done()
    if not output.exists():
        return done
    keep = 0
    with output.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # the write a kill interrupted
            try:
                record = json.loads(raw)
                match = LINE_ID.match(record["id"])
            except (ValueError, KeyError, TypeError):
                match = None
            if match is None:
                raise ValueError(
                    f"{output}: line {raw[:80]!r} was not written by a decision batch; "
                    "use a new output file"
                )
            done.add(int(match.group(1)))
            done.failed += failed(record)
            keep += len(raw)
    if keep != output.stat().st_size:
        with output.open("r+b") as f:
            f.truncate(keep)
    return done


def failed(record: Any) -> bool:
    """Whether an output line answers its input line with an error: an ``error``, or a status other than 200."""
    response = record.get("response") if isinstance(record, dict) else None
    status = response.get("status_code") if isinstance(response, dict) else None
    return (
        not isinstance(record, dict) or record.get("error") is not None or status != 200
    )


@dataclass(frozen=True)
class TooLong:
    """A line over the size limit, read past rather than into memory."""

    size: int  # its bytes, up to its \n


def lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, str | TooLong]]:
    """(line number from 1, text without its ``\\n``) for each non-blank line, read as it goes. Lines end at
    ``\\n`` only, as JSON Lines do: a bare ``\\r`` is JSON whitespace, not the end of a line. A line of
    more than ``limit`` bytes comes as :class:`TooLong`, never read whole, so it is refused in place
    (:func:`too_long`). A line that is not UTF-8 is still one line: its bytes that aren't UTF-8 come as
    lone surrogates (``surrogateescape``), which :func:`unreadable` finds, so it is answered in place
    instead of ending the run."""
    with path.open("rb") as f:
        number = 0
        while raw := f.readline(-1 if limit is None else limit + 1):
            number += 1
            if limit is not None and len(raw) > limit and not raw.endswith(b"\n"):
                yield number, TooLong(len(raw) + _skip_line(f))
            elif raw.strip():
                yield number, raw.removesuffix(b"\n").decode("utf-8", "surrogateescape")


def _skip_line(f: BinaryIO) -> int:
    """Read past the rest of the line, a bounded chunk at a time: the bytes before its ``\\n``."""
    skipped = 0
    while chunk := f.readline(SKIP_CHUNK):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk) - 1
        skipped += len(chunk)
    return skipped


def too_long(number: int, size: int, limit: int) -> str:
    """Why line ``number``, of ``size`` bytes, is refused unread."""
    return (
        f"line {number}: {size} bytes, over the limit of {limit} bytes a line (a request body) may "
        f"have; set {PREFIX}MAX_BODY_BYTES to raise it"
    )


def unreadable(number: int, text: str) -> str | None:
    """Why line ``number`` can't be read as text (it is not UTF-8), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = len(text[: exc.start].encode("utf-8", "surrogateescape"))
        return f"line {number}: not valid UTF-8 (at byte {where} of the line); a batch file must be UTF-8"
    return None


def invalid_line(number: int, request_id: str, problem: str) -> str:
    """The output line for an input line that is no request: its error, with no custom_id (unread)."""
    return output_line(
        number,
        request_id,
        None,
        None,
        None,
        {"code": "invalid_line", "message": problem},
    )


def output_line(
    line: int,
    request_id: str,
    custom_id: Any,
    status: int | None,
    body: Any,
    error: Any,
) -> str:
    response = (
        None
        if status is None
        else {"status_code": status, "request_id": request_id, "body": body}
    )
    record = {
        "id": f"batch-L{line}-{request_id}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }
    return json.dumps(record, ensure_ascii=False) + "\n"


class Writer:
    """Appends output lines, each flushed to the OS as it is written (a killed run keeps them)."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("a", encoding="utf-8")

    def write(self, text: str) -> None:
        self.file.write(text)
        self.file.flush()

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
