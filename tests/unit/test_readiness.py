"""The readiness object: the step a starting server is in, its progress and time left in the 503
message and Retry-After, the log lines at intervals, failure, and waiting until settled."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import pytest

from vllm.entrypoints.generate.decisions.decide.errors import (
    DecisionError,
    NotReadyError,
)
from vllm.entrypoints.generate.decisions.decide.serving import (
    readiness as readiness_module,
)
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    SELF_CHECK,
    Readiness,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refusal(readiness: Readiness) -> DecisionError:
    with pytest.raises(DecisionError) as caught:
        readiness.check()
    return caught.value


def test_before_any_step_it_is_starting():
    error = refusal(Readiness())
    assert (
        isinstance(error, NotReadyError)
        and error.status == HTTPStatus.SERVICE_UNAVAILABLE
    )
    assert (
        error.message == "decisions are starting; retry shortly"
        and error.retry_after == 5
    )


def test_the_message_names_the_step_and_how_far_it_is():
    clock = Clock()
    readiness = Readiness(clock)
    readiness.begin(SELF_CHECK)
    assert (
        refusal(readiness).message
        == "decisions are starting: self-check; retry shortly"
    )
    readiness.begin(CALIBRATION)
    assert (
        refusal(readiness).message
        == "decisions are starting: calibration; retry shortly"
    )
    readiness.count(300, "reads")
    readiness.advance(4)
    error = refusal(readiness)
    assert error.message == (
        "decisions are starting: calibration, 4 of 300 reads, time left unknown yet; retry shortly"
    )
    assert error.retry_after == 5, "no estimate yet: the default"
    clock.now += 10
    readiness.advance(4)  # 8 in 10 s: 292 more take about 365 s
    error = refusal(readiness)
    assert "calibration, 8 of 300 reads, about 365 s left" in error.message
    assert error.retry_after == 15, "a long wait: the longest Retry-After"
    readiness.advance(284)  # 292 in 10 s: 8 more take about 0.3 s
    assert "292 of 300 reads, about 1 s left" in refusal(readiness).message
    assert refusal(readiness).retry_after == 5, "never shorter than 5 s"
    clock.now += 2.5
    readiness.advance(8)  # every read done: the fits are computed
    assert "fitting" in refusal(readiness).message


def test_retry_after_follows_the_time_left_between_the_bounds():
    clock = Clock()
    readiness = Readiness(clock)
    readiness.begin(CALIBRATION)
    readiness.count(20, "reads")
    clock.now += 10
    readiness.advance(10)  # 1 s each: 10 s left
    assert refusal(readiness).retry_after == 10
    assert "10 of 20 reads, about 10 s left" in refusal(readiness).message


def test_a_process_waiting_for_another_says_so_without_progress():
    readiness = Readiness(Clock())
    readiness.begin(CALIBRATION)
    readiness.waiting()
    error = refusal(readiness)
    assert error.message == (
        "decisions are starting: calibration, waiting for another API-server process's calibration; retry shortly"
    )
    assert (
        error.retry_after == 5 and "of" not in error.message.split("calibration, ")[1]
    )
    readiness.count(10, "reads")  # its wait ran out: it reads here after all
    assert "waiting" not in refusal(readiness).message
    readiness.begin(SELF_CHECK)
    readiness.waiting()
    assert (
        "waiting for another API-server process's self-check"
        in refusal(readiness).message
    )


def test_ready_answers_and_a_failure_is_unavailable_with_the_reason():
    readiness = Readiness()
    readiness.begin(SELF_CHECK)
    readiness.succeed()
    readiness.check()
    readiness.waiting()  # another backend started later: no longer a startup step
    readiness.check()
    failed = Readiness()
    failed.begin(SELF_CHECK)
    failed.fail("the model's next token is not an option letter")
    error = refusal(failed)
    assert (
        not isinstance(error, NotReadyError)
        and error.status == HTTPStatus.SERVICE_UNAVAILABLE
    )
    assert (
        error.message
        == "decisions are unavailable: the model's next token is not an option letter"
    )
    assert error.retry_after is None, "waiting won't help"


def test_progress_is_logged_when_the_estimate_is_first_known_then_at_intervals(
    monkeypatch,
):
    lines = []
    monkeypatch.setattr(
        readiness_module.logger, "info", lambda fmt, *args: lines.append(fmt % args)
    )
    clock = Clock()
    readiness = Readiness(clock)
    readiness.begin(CALIBRATION)
    readiness.count(100, "reads")
    for _ in range(7):
        clock.now += 1
        readiness.advance()
    assert lines == []
    clock.now += 1
    readiness.advance()  # the 8th: the first estimate
    assert lines == ["decision calibration: 8 of 100 reads, about 92 s left"]
    for _ in range(30):
        clock.now += 1
        readiness.advance()
    assert lines[1:] == [
        "decision calibration: 18 of 100 reads, about 82 s left",
        "decision calibration: 28 of 100 reads, about 72 s left",
        "decision calibration: 38 of 100 reads, about 62 s left",
    ]
    readiness.advance(62)
    assert len(lines) == 4, "no progress line once every read is done"


async def test_settled_waits_for_ready_or_failure():
    for finish in (lambda r: r.succeed(), lambda r: r.fail("broken")):
        readiness = Readiness()
        readiness.begin(SELF_CHECK)
        waiter = asyncio.ensure_future(readiness.settled())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        finish(readiness)
        await asyncio.wait_for(waiter, 1)
        await asyncio.wait_for(readiness.settled(), 1)  # already settled: at once
        assert readiness.finished
