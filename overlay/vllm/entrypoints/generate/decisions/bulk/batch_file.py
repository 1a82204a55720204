# SPDX-License-Identifier: Apache-2.0
"""Batch files as ``vllm run-batch`` reads and writes them, streamed and resumable: each output ``id``
(``batch-L<line>-...``) names the input line it answers, so a rerun skips the lines already written.
Lines end at ``\\n`` only: a ``\\r`` is JSON whitespace."""

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
# How much of a line over the size limit is read at a time, past it.
SKIP_CHUNK = 1 << 20


@dataclass
class Done:
    """The input lines an earlier run answered (every line below ``below``, and ``beyond``: memory stays
    bounded), and how many of them ``failed``."""

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
        os.truncate(output, keep)
    return done


def failed(record: Any) -> bool:
    """Whether an output line has an ``error`` or a status other than 200."""
    response = record.get("response") if isinstance(record, dict) else None
    status = response.get("status_code") if isinstance(response, dict) else None
    return status != 200 or record.get("error") is not None


@dataclass(frozen=True)
class TooLong:
    """A line over the size limit, read past rather than into memory."""

    size: int  # its bytes, up to its \n


def lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, str | TooLong]]:
    """(number from 1, text) of each non-blank line, read as it goes; a line over ``limit`` bytes comes
    as :class:`TooLong`, never read whole. Bytes that aren't UTF-8 come as lone surrogates, which
    :func:`unreadable` finds, so such a line is answered in place instead of ending the run."""
    with path.open("rb") as f:
        number = 0
        while raw := f.readline(-1 if limit is None else limit + 1):
            number += 1
            if limit is not None and len(raw) > limit and not raw.endswith(b"\n"):
                yield number, TooLong(len(raw) + _skip_line(f))
            elif raw.strip():
                yield number, raw.removesuffix(b"\n").decode("utf-8", "surrogateescape")


def _skip_line(f: BinaryIO) -> int:
    """Read past the rest of the line: the bytes before its ``\\n``."""
    skipped = 0
    while chunk := f.readline(SKIP_CHUNK):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk) - 1
        skipped += len(chunk)
    return skipped


def too_long(number: int, size: int, limit: int) -> str:
    return (
        f"line {number}: {size} bytes, over the limit of {limit} bytes a line (a request body) may "
        f"have; set {PREFIX}MAX_BODY_BYTES to raise it"
    )


def unreadable(number: int, text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = len(text[: exc.start].encode("utf-8", "surrogateescape"))
        return f"line {number}: not valid UTF-8 (at byte {where} of the line); a batch file must be UTF-8"
    return None


def invalid_line(number: int, request_id: str, problem: str) -> str:
    error = {"code": "invalid_line", "message": problem}
    return output_line(number, request_id, None, None, None, error)


def line_fault(number: Any, request_id: str) -> dict[str, str]:
    """The error of a line whose answering faulted, logged under ``request_id``."""
    message = f"line {number}: internal error; the log has the details (look for {request_id})"
    return {"code": "internal_error", "message": message}


def output_line(
    line: int,
    request_id: str,
    custom_id: Any,
    status: int | None,
    body: Any,
    error: Any,
) -> str:
    response = {"status_code": status, "request_id": request_id, "body": body}
    record = {
        "id": f"batch-L{line}-{request_id}",
        "custom_id": custom_id,
        "response": None if status is None else response,
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
