"""``vllm run-batch`` with decision lines, on the tiny Qwen model: every line answered or refused in place
(the server's status and body; a line that isn't UTF-8, holds a number no parser takes or is over the
body limit answered as an invalid line, the run going on and its exit status counting the failed lines;
a bare \\r inside a line not ending it), other URLs served by vLLM's own handlers, a kill -9 mid-run and a rerun
giving each line exactly once with the answers of an uninterrupted run (itself run with
``--data-parallel-size 2``), and the same probabilities as ``vllm serve`` for the same request."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ..conftest import engine_binding, model_path
from .conftest import TINY_QWEN_KEY

MODEL = model_path("tiny-qwen2-random")
# As the tiny server is configured (conftest.tiny_qwen_server), so the answers compare.
ENV = {
    "VLLM_ENABLE_TYPED_DECISIONS": "1",
    "VLLM_TYPED_DECISIONS_MIN_OPTION_MASS": "0",
    "VLLM_TYPED_DECISIONS_BACKEND": "logit",
    "VLLM_TYPED_DECISIONS_DEBIAS": "off",
    "VLLM_TYPED_DECISIONS_CALIBRATION": "off",
    "HF_HUB_OFFLINE": "1",
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
# BULK_TEST_LINES=10000 repeats the checks at the size docs/bulk.md reports.
LINES = int(os.environ.get("BULK_TEST_LINES", "400"))


def openai_body(i: int) -> dict:
    return {
        "model": "m",
        "input": f"Ticket {i % 40}: the payout to account {i % 40} is late.",
        "questions": [
            {"type": "predicate", "instructions": f"Is question {i % 3} urgent?"},
            {
                "type": "choice",
                "instructions": "Which team?",
                "choices": [
                    {"value": "billing"},
                    {"value": "tech"},
                    {"value": "sales"},
                ],
            },
        ],
    }


def jev_body(i: int) -> dict:
    return {
        "state": f"Ticket {i % 40}: the payout to account {i % 40} is late.",
        "questions": {
            "urgent": {"type": "noul", "instructions": f"Is question {i % 3} urgent?"}
        },
    }


def batch_lines() -> list[str]:
    lines = []
    for i in range(LINES):
        url, body = (
            ("/v1/decisions", openai_body(i))
            if i % 2
            else ("/v1/systemone", jev_body(i))
        )
        if i == 7:
            body = {
                "model": "m",
                "input": "x",
                "questions": [],
            }  # refused: at least one question
        if i == 11:
            url, body = (
                "/api/alpha/decisions",
                {
                    "state": "x",
                    "questions": {"q": {"type": "noul", "instruction": "?"}},
                },
            )
        lines.append(
            json.dumps(
                {"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body}
            )
        )
    lines.insert(20, "{this is not json")
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    lines.insert(
        30,
        json.dumps(
            {
                "custom_id": "chat",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": chat,
            }
        ),
    )
    # Hostile lines, at the end so the lines above keep their numbers: a T whose scaled scores overflowed
    # (answered null), on both wires, and a number of more digits than int() converts (ended the run).
    lines.append(
        json.dumps(
            {
                "custom_id": "tiny-t",
                "method": "POST",
                "url": "/v1/decisions",
                "body": {
                    **openai_body(1),
                    "extra": {"calibration_temperature": 5e-324},
                },
            }
        )
    )
    lines.append(
        json.dumps(
            {
                "custom_id": "tiny-t-jev",
                "method": "POST",
                "url": "/v1/systemone",
                "body": {**jev_body(2), "extra": {"calibration_temperature": 1e-310}},
            }
        )
    )
    lines.append(
        '{"custom_id": "huge", "method": "POST", "url": "/v1/decisions", "body": {"seed": '
        + "9" * 5000
        + "}}"
    )
    return lines


# A line that is not UTF-8 (it ended the run): the batch file's last line.
NOT_UTF8 = (
    json.dumps(
        {
            "custom_id": "latin-1",
            "method": "POST",
            "url": "/v1/decisions",
            "body": openai_body(3),
        }
    )
    .encode()
    .replace(b"late", b"l\xe4te")
)
# A line with a bare \r inside, JSON whitespace (universal newlines made it two lines), and a line over
# the body limit the runs are given, refused unread: after NOT_UTF8, the batch file's last lines.
WITH_CR = (
    json.dumps(
        {
            "custom_id": "cr",
            "method": "POST",
            "url": "/v1/systemone",
            "body": jev_body(4),
        }
    )
    .replace(', "method"', ',\r"method"')
    .encode()
)
MAX_BODY_BYTES = 65536
OVER_LIMIT = json.dumps(
    {
        "custom_id": "over",
        "method": "POST",
        "url": "/v1/decisions",
        "body": {**openai_body(5), "input": "late " * (MAX_BODY_BYTES // 5)},
    }
).encode()
# The input lines that fail (besides the three the first tests check): the hostile ones.
HOSTILE = 5
# vllm run-batch's exit status when every line is answered but some with an error (bulk/run_batch.py).
FAILED_LINES_EXIT = 3


def batch_file(path: Path) -> Path:
    last = [NOT_UTF8, WITH_CR, OVER_LIMIT]
    path.write_bytes(
        b"".join(line + b"\n" for line in [*map(str.encode, batch_lines()), *last])
    )
    return path


def input_lines(path: Path) -> list[bytes]:
    """A batch file's lines, split where run-batch splits them: at \\n only."""
    return path.read_bytes().split(b"\n")[:-1]


def run_batch(
    source: Path,
    target: Path,
    in_flight: int = 64,
    replicas: int = 1,
    niceness: int = 0,
) -> subprocess.Popen:
    command = [
        *(["nice", "-n", str(niceness)] if niceness else []),
        str(Path(sys.executable).parent / "vllm"),
        "run-batch",
        "-i",
        str(source),
        "-o",
        str(target),
        "--model",
        str(MODEL),
        "--served-model-name",
        "m",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--enable-prefix-caching",
        "--data-parallel-size",
        str(replicas),
    ]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLLM_TYPED")},
        **ENV,
        "VLLM_TYPED_DECISIONS_BULK_IN_FLIGHT": str(in_flight),
        # small, so the line over it is small too
        "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        **engine_binding(replicas),
    }
    log = target.with_suffix(".log").open("a")
    # Its own process group, so a kill reaches the engine processes too.
    return subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def finished(process: subprocess.Popen, log: Path) -> None:
    """The run ended having answered every line, some with an error (the input has bad lines)."""
    assert process.wait(timeout=600) == FAILED_LINES_EXIT, log.read_text(
        errors="replace"
    )[-3000:]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def by_line(path: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for record in records(path):
        line = int(record["id"].split("-")[1].removeprefix("L"))
        assert line not in out, f"line {line} answered twice"
        out[line] = record
    return out


def probabilities(record: dict) -> list[float]:
    body = record["response"]["body"]
    if "answers" not in body:
        return []
    answers = (
        body["answers"].values()
        if isinstance(body["answers"], dict)
        else body["answers"]
    )
    found = []
    for answer in answers:
        if "probability" in answer:
            found.append(answer["probability"])
        elif "noul" in answer:
            found.append(answer["noul"])
        else:
            found += [p["probability"] for p in answer["probabilities"]]
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, on two data-parallel engine replicas."""
    folder = tmp_path_factory.mktemp("bulk")
    source = batch_file(folder / "in.jsonl")
    target = folder / "reference.jsonl"
    finished(run_batch(source, target, replicas=2), target.with_suffix(".log"))
    return source, target


@pytest.mark.vllm032
def test_every_line_is_answered_or_refused_in_place(reference):
    source, target = reference
    answered = by_line(target)
    total = len(input_lines(source))
    assert sorted(answered) == list(range(1, total + 1))
    status = {
        r["custom_id"]: (r["response"] or {}).get("status_code")
        for r in answered.values()
    }
    assert (
        status["line-7"] == 400 and status["line-11"] == 422 and status["chat"] == 200
    )
    # all but lines 7 and 11, and the chat line and the line with a \r
    assert sum(s == 200 for s in status.values()) == LINES - 2 + 2
    bad = answered[21]  # the line that isn't JSON
    assert (
        bad["custom_id"] is None
        and bad["response"] is None
        and bad["error"]["code"] == "invalid_line"
    )
    refused = answered[8]["response"]["body"]
    assert (
        "questions" in refused["error"]["message"]
        and refused["error"]["type"] == "BadRequestError"
    )
    assert answered[12]["response"]["body"]["detail"][0]["loc"] == [
        "body",
        "questions",
        "q",
        "instruction",
    ]
    assert answered[31]["response"]["body"]["object"] == "chat.completion"
    # The hostile lines: each answered in place, none with a null where a number belongs.
    tiny, tiny_jev, huge, latin, cr, over = (
        answered[total - i] for i in (5, 4, 3, 2, 1, 0)
    )
    assert tiny["custom_id"] == "tiny-t" and tiny["response"]["status_code"] == 400
    assert (
        "VLLM_TYPED_DECISIONS_MIN_TEMPERATURE"
        in tiny["response"]["body"]["error"]["message"]
    )
    assert (
        tiny_jev["custom_id"] == "tiny-t-jev"
        and tiny_jev["response"]["status_code"] == 422
    )
    assert (
        huge["error"]["code"] == "invalid_line"
        and "4300 digits" in huge["error"]["message"]
    )
    assert (
        latin["error"]["code"] == "invalid_line"
        and "not valid UTF-8" in latin["error"]["message"]
    )
    assert cr["custom_id"] == "cr" and cr["response"]["status_code"] == 200
    assert over["custom_id"] is None and over["error"]["code"] == "invalid_line"
    assert over["error"]["message"].startswith(
        f"line {total}: {len(OVER_LIMIT)} bytes, over the limit of {MAX_BODY_BYTES}"
    )
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in over["error"]["message"]
    failed = sum(
        r["error"] is not None or r["response"]["status_code"] != 200
        for r in answered.values()
    )
    assert failed == 3 + HOSTILE
    log = target.with_suffix(".log").read_text(errors="replace")
    assert (
        f"({failed} failed, 0 already answered)" in log
        and f"{failed} of {total} lines in" in log
    )


# A killed run's input: the reference's lines this many times over, so the run can't finish between
# the poll that sees it mid-run and the kill, however long this process waits for the CPU (with the
# reference's 406 lines it once did, twice: a busy 2-core machine stalled the poll for seconds).
COPIES = 8


def copy_id(custom_id: object, copy: int) -> object:
    """A line's custom_id in its ``copy``-th repeat: suffixed (the first copy is the line itself)."""
    return f"{custom_id}~{copy}" if copy and isinstance(custom_id, str) else custom_id


def repeated(source: Path, path: Path) -> Path:
    """``source``'s lines COPIES times over, each JSON line's custom_id told apart by copy_id (a line
    that isn't JSON repeats as it is): each line asks what its original asks."""
    lines = []
    for copy in range(COPIES):
        for raw in input_lines(source):
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if isinstance(record, dict) and "custom_id" in record:
                record["custom_id"] = copy_id(record["custom_id"], copy)
                raw = json.dumps(record).encode()
            lines.append(raw)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_a_killed_run_resumes_to_the_same_output(reference, tmp_path):
    original, expected = reference
    source = repeated(original, tmp_path / "in.jsonl")
    target = tmp_path / "killed.jsonl"
    # One line in flight and a yielding run, so the poll sees it mid-run; it is killed a sixth of the
    # way through the first copy, with seven copies still to answer.
    process = run_batch(source, target, in_flight=1, niceness=19)
    deadline = time.monotonic() + 300
    try:
        while not target.exists() or len(target.read_text().splitlines()) < LINES // 6:
            assert process.poll() is None, target.with_suffix(".log").read_text(
                errors="replace"
            )[-3000:]
            assert time.monotonic() < deadline, (
                "the batch wrote too few lines to kill it mid-run"
            )
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a run that died is reaped
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    written = len(target.read_text().splitlines())
    assert written < len(input_lines(source)), "the run had finished before the kill"
    finished(run_batch(source, target), target.with_suffix(".log"))
    log = target.with_suffix(".log").read_text(errors="replace")
    assert f"{written} lines of" in log or f"{written - 1} lines of" in log, (
        "the rerun did not resume"
    )
    resumed, reference_lines = by_line(target), by_line(expected)
    assert sorted(resumed) == list(range(1, COPIES * len(reference_lines) + 1))
    for line, again in resumed.items():
        copy, at = divmod(line - 1, len(reference_lines))
        record = reference_lines[at + 1]
        assert again["custom_id"] == copy_id(record["custom_id"], copy), line
        assert (again["response"] or {}).get("status_code") == (
            record["response"] or {}
        ).get("status_code"), line
        if (
            record["response"]
            and record["response"]["status_code"] == 200
            and record["custom_id"] != "chat"
        ):
            assert probabilities(again) == pytest.approx(
                probabilities(record), abs=2e-3
            ), line


@pytest.mark.vllm032
def test_answers_equal_the_servers(reference, tiny_qwen_server):
    _, target = reference
    for record in list(by_line(target).values())[:40]:
        if (
            not str(record["custom_id"]).startswith("line-")
            or record["response"]["status_code"] != 200
        ):
            continue
        i = int(record["custom_id"].split("-")[1])
        path, body = (
            ("/v1/decisions", openai_body(i))
            if i % 2
            else ("/v1/systemone", jev_body(i))
        )
        served = httpx.post(
            tiny_qwen_server.url + path,
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {TINY_QWEN_KEY}"},
        )
        assert served.status_code == 200, served.text
        assert probabilities({"response": {"body": served.json()}}) == pytest.approx(
            probabilities(record), abs=2e-3
        )
