"""Bulk never loses or hides a line: a line that isn't UTF-8, holds a number no field takes, or meets a
fault while answered gets its own output line with the error, the run goes on to every other line, and
the run's exit status and summary count the failed lines. ``vllm run-batch``'s loop (run_decision_batch)
over a decision service with scripted scores; tests/server/test_bulk.py runs the real command."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace

import pytest
from starlette.datastructures import State

from vllm.entrypoints.generate.decisions.bulk import run_batch
from vllm.entrypoints.generate.decisions.bulk.batch_file import (
    lines,
    output_line,
    resume,
    unreadable,
)
from vllm.entrypoints.generate.decisions.bulk.in_process import Decisions
from vllm.entrypoints.generate.decisions.bulk.run_batch import (
    FAILED_LINES_EXIT,
    Line,
    answer_line,
    run_decision_batch,
)
from vllm.entrypoints.generate.decisions.decide.serving.service import DecisionService
from vllm.entrypoints.generate.decisions.decide.settings import Settings
from vllm.entrypoints.generate.decisions.runtime.adapters import ServedModels

from .fakes import ScriptedBackend


def request(custom_id: str, **extra) -> bytes:
    body = {
        "model": "m",
        "input": "The parcel is late.",
        "questions": [{"type": "predicate", "instructions": "Late?"}],
    }
    if extra:
        body["extra"] = extra
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/decisions", "body": body}
    ).encode()


HUGE = (
    b'{"custom_id": "huge", "method": "POST", "url": "/v1/decisions", "body": {"seed": '
    + b"9" * 5000
    + b"}}"
)
NOT_UTF8 = request("latin-1").replace(b"late", b"l\xe4te")


def test_a_line_that_is_not_utf8_is_still_a_line_and_found_unreadable(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(request("a") + b"\n" + NOT_UTF8 + b"\n\n" + request("b") + b"\n")
    read = list(lines(source))
    assert [n for n, _ in read] == [1, 2, 4]
    assert unreadable(1, read[0][1]) is None and unreadable(4, read[2][1]) is None
    at = NOT_UTF8.index(b"\xe4")
    assert (
        unreadable(2, read[1][1])
        == f"line 2: not valid UTF-8 (at byte {at} of the line); a batch file must be UTF-8"
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (NOT_UTF8.decode("utf-8", "surrogateescape"), "not valid UTF-8"),
        (HUGE.decode(), "more than 4300 digits"),
        ('{"url": "/v1/decisions", "body": -1e400}', "too large for a 64-bit float"),
    ],
)
def test_a_line_no_parser_takes_is_a_problem_not_an_exception(text, needle):
    line = Line.parse(7, text)
    assert (
        line.record is None
        and line.problem.startswith("line 7: ")
        and needle in line.problem
    )


async def test_a_fault_answering_a_line_is_its_internal_error(monkeypatch, caplog):
    class Faulty:
        async def decide(self, *args, **kwargs):
            raise RuntimeError("secret sk-1 at /home/op/x.py")

    line = Line.parse(3, request("c").decode())
    status, body, error, custom_id = await answer_line(Faulty(), line, "rid-1")  # type: ignore[arg-type]
    assert (status, body, custom_id, error["code"]) == (
        None,
        None,
        "c",
        "internal_error",
    )
    assert "rid-1" in error["message"] and "sk-1" not in error["message"]
    assert (
        "line 3 (request rid-1) failed" in caplog.text and "secret sk-1" in caplog.text
    )


async def start_service(env: dict[str, str] | None = None) -> DecisionService:
    service = DecisionService(
        Settings.from_env(env or {}), ScriptedBackend(lambda q: [0.0, -1.0]), "m"
    )
    await service.start()
    return service


async def run(source, target, service) -> int:
    state = State()
    state.decision_service = ServedModels(service)  # as startup serves it
    try:
        # type: ignore[arg-type]
        await run_decision_batch(
            None, Namespace(input_file=str(source), output_file=str(target)), {}, state
        )
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


async def test_every_line_gets_one_output_line_and_the_exit_status_counts_the_failed(
    tmp_path, monkeypatch, capfd
):
    decide = Decisions.decide

    async def faulty_decide(
        self, body, url="/v1/decisions", request_id=None, source=None
    ):
        if b'"boom"' in (source or b""):
            raise RuntimeError("an unexpected fault")
        return await decide(self, body, url, request_id, source)

    monkeypatch.setattr(Decisions, "decide", faulty_decide)
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(
        b"\n".join(
            [
                request("a"),
                NOT_UTF8,
                HUGE,
                request("boom"),
                request("t", calibration_temperature=5e-324),
                request("b"),
            ]
        )
        + b"\n"
    )
    service = await start_service()
    assert await run(source, target, service) == FAILED_LINES_EXIT
    out = {
        int(r["id"].split("-")[1][1:]): r
        for r in map(json.loads, target.read_text().splitlines())
    }
    assert sorted(out) == [1, 2, 3, 4, 5, 6]
    assert out[1]["response"]["status_code"] == out[6]["response"]["status_code"] == 200
    assert out[2]["error"]["code"] == out[3]["error"]["code"] == "invalid_line"
    assert (
        "not valid UTF-8" in out[2]["error"]["message"]
        and "4300 digits" in out[3]["error"]["message"]
    )
    assert out[4]["custom_id"] == "boom" and out[4]["error"]["code"] == "internal_error"
    assert (
        out[5]["response"]["status_code"] == 400
        and "MIN_TEMPERATURE" in out[5]["response"]["body"]["error"]["message"]
    )
    logged = capfd.readouterr().out
    assert (
        "6 lines in" in logged
        and "(4 failed, 0 already answered)" in logged
        and "4 of 6 lines in" in logged
    )

    # A rerun answers nothing again, and still says the output holds failed lines.
    assert await run(source, target, service) == FAILED_LINES_EXIT
    assert len(target.read_text().splitlines()) == 6 and resume(target).failed == 4
    assert "(0 failed, 6 already answered (4 of them failed))" in capfd.readouterr().out


async def test_a_run_whose_every_line_is_answered_exits_0(tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(request("a") + b"\n" + request("b") + b"\n")
    assert await run(source, target, await start_service()) == 0
    assert len(target.read_text().splitlines()) == 2


async def test_a_failed_write_stops_the_run_instead_of_losing_lines(
    tmp_path, monkeypatch
):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"\n".join(request(f"l{i}") for i in range(5)) + b"\n")
    write = run_batch.Writer.write

    def full_disk(self, text):
        if '"l3"' in text:
            raise OSError(28, "No space left on device")
        write(self, text)

    monkeypatch.setattr(run_batch.Writer, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        await run(source, target, await start_service())
    assert '"l3"' not in target.read_text()  # a rerun answers it


def test_output_lines_count_as_failed_unless_200():
    records = [
        json.loads(output_line(1, "r", "x", status, {}, error))
        for status, error in [
            (200, None),
            (400, None),
            (None, {"code": "invalid_line"}),
            (500, None),
        ]
    ]
    from vllm.entrypoints.generate.decisions.bulk.batch_file import failed

    assert [failed(r) for r in records] == [False, True, True, True]


def test_ray_decide_forwards_no_secret_to_rays_runtime_env():
    """Ray shows a runtime_env to whoever can see the cluster: HF_TOKEN and VLLM_API_KEY stay home."""
    from tools.examples import ray_decide as tool

    environ = {
        "HF_TOKEN": "hf_x",
        "HUGGING_FACE_HUB_TOKEN": "hf_y",
        "HF_HOME": "/cache",
        "VLLM_API_KEY": "k",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "2",
        "AWS_SECRET_ACCESS_KEY": "s",
        "VLLM_S3_SECRET": "s",
        "HF_HUB_OFFLINE": "1",
        "PATH": "/bin",
    }
    assert tool.forwarded(environ) == {
        "HF_HOME": "/cache",
        "VLLM_TYPED_DECISIONS_BACKEND": "logit",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "2",
        "HF_HUB_OFFLINE": "1",
    }


def by_line(target) -> dict[int, dict]:
    return {
        int(r["id"].split("-")[1][1:]): r
        for r in map(json.loads, target.read_text().splitlines())
    }


SMALL_LIMIT = {"VLLM_TYPED_DECISIONS_MAX_BODY_BYTES": "2048"}


async def test_lines_split_at_newline_only_and_a_line_over_the_limit_is_refused_in_place(
    tmp_path,
):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inside_cr = request("cr").replace(b'"method"', b'\r"method"')
    over = request("over", note="x" * 3000)
    source.write_bytes(
        inside_cr + b"\n" + request("crlf") + b"\r\n" + over + b"\n" + request("after")
    )
    service = await start_service(SMALL_LIMIT)
    assert await run(source, target, service) == FAILED_LINES_EXIT
    out = by_line(target)
    assert sorted(out) == [1, 2, 3, 4]
    assert [out[n]["custom_id"] for n in (1, 2, 4)] == ["cr", "crlf", "after"]
    assert all(out[n]["response"]["status_code"] == 200 for n in (1, 2, 4))
    refused = out[3]
    assert refused["custom_id"] is None and refused["response"] is None
    assert refused["error"]["code"] == "invalid_line"
    message = refused["error"]["message"]
    assert message.startswith(f"line 3: {len(over)} bytes, over the limit of 2048")
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in message


async def test_the_ray_stage_refuses_a_body_or_line_over_the_limit_in_its_row():
    from vllm.entrypoints.generate.decisions.bulk.ray_data import DecisionStage

    # the stage's handling of rows, without its engine or Ray
    stage = object.__new__(DecisionStage)
    stage.decisions = Decisions(await start_service(SMALL_LIMIT))
    stage.gate = asyncio.Semaphore(4)
    over = request("over", note="x" * 3000).decode()
    answered = await stage._lines(
        {"line": [1, 2], "text": [over, request("a").decode()]}
    )
    refused, fine = (json.loads(text) for text in answered["text"])
    assert refused["id"].startswith("batch-L1-") and refused["response"] is None
    assert refused["error"]["message"].startswith(f"line 1: {len(over)} bytes, over")
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in refused["error"]["message"]
    assert fine["custom_id"] == "a" and fine["response"]["status_code"] == 200

    bodies = [json.dumps(json.loads(over)["body"]), json.loads(request("b"))["body"]]
    rows = await stage._rows({"body": bodies})
    assert rows["status_code"] == [413, 200]
    assert "VLLM_TYPED_DECISIONS_MAX_BODY_BYTES" in rows["response"][0]
