"""Startup work once per server under several API-server processes: the file lock, a crashed holder,
a stuck holder, and calibration and startup checks done by one caller and loaded by the others."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

from vllm.entrypoints.generate.decisions.calibration.calibrate import (
    startup_calibration,
)
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import exclusive
from vllm.entrypoints.generate.decisions.decide.backends.logit import LogitBackend
from vllm.entrypoints.generate.decisions.decide.serving.readiness import (
    CALIBRATION,
    Readiness,
)
from vllm.entrypoints.generate.decisions.runtime.startup import start_backend_once

from .fakes import ScriptedBackend, TokenizerHost
from .test_calibration_startup import (
    MODEL,
    calibrated_temperatures,
    overconfident,
    settings,
    write_questions,
)


async def test_one_holder_at_a_time(tmp_path):
    lock, order = tmp_path / "x.lock", []

    async def work(name: str) -> None:
        async with exclusive(lock, 30, "test") as held:
            assert held
            order.append(f"{name} in")
            await asyncio.sleep(0.3)
            order.append(f"{name} out")

    await asyncio.gather(work("a"), work("b"))
    assert order in (
        ["a in", "a out", "b in", "b out"],
        ["b in", "b out", "a in", "a out"],
    )


async def test_a_crashed_holder_frees_the_lock(tmp_path):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time\n"
                f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    asyncio.get_running_loop().call_later(0.5, holder.kill)  # the holder dies mid-work
    async with exclusive(lock, 30, "test") as held:
        assert held and 0.4 < time.monotonic() - started < 10
    holder.wait()


async def test_a_stuck_holder_is_waited_for_only_so_long(tmp_path, caplog):
    lock = tmp_path / "x.lock"
    async with exclusive(lock, 30, "test"), exclusive(lock, 0.5, "test") as held:
        assert not held
    assert (
        "waited 0.5 s for another API-server process (VLLM_TYPED_DECISIONS_STARTUP_WAIT); doing it here"
        in caplog.text
    )


async def test_no_lock_file_no_wait(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    async with exclusive(tmp_path / "file" / "x.lock", 30, "test") as held:
        assert not held
    assert "no lock file" in caplog.text


async def test_concurrent_processes_calibrate_once(tmp_path):
    source = write_questions(tmp_path / "q.jsonl", 200)
    reads = []
    backends = [
        ScriptedBackend(lambda q: reads.append(q) or overconfident(q)) for _ in range(3)
    ]
    results = await asyncio.gather(
        *(
            calibrated_temperatures(b, settings(tmp_path, source), MODEL)
            for b in backends
        )
    )
    assert len(reads) == 200, "one caller measured; the others loaded its result"
    assert len({r.server.value for r in results}) == 1 and all(
        r.server.source == "calibrated" for r in results
    )


async def test_only_the_calibrating_process_counts_progress_the_others_say_they_wait(
    tmp_path,
):
    source = write_questions(tmp_path / "q.jsonl", 200)
    backends = [ScriptedBackend(overconfident, delay=0.01) for _ in range(3)]
    progress = [Readiness() for _ in backends]
    for readiness in progress:
        readiness.begin(CALIBRATION)
    config = settings(tmp_path, source)
    runs = [
        startup_calibration(b, config, MODEL, p)
        for b, p in zip(backends, progress, strict=True)
    ]
    calibrating = asyncio.gather(*runs)
    for _ in range(1000):  # until one process has read and the two others wait
        if (
            any(p.progress and p.progress.done for p in progress)
            and sum(p.waiting_for_other for p in progress) == 2
        ):
            break
        await asyncio.sleep(0.01)
    messages = sorted(p.message() for p in progress)
    assert re.search(r"calibration, \d+ of 200 reads", messages[0]), messages
    assert all(
        "waiting for another API-server process's calibration" in m
        for m in messages[1:]
    ), messages
    await calibrating
    (counted,) = [p.progress for p in progress if p.progress is not None]
    assert counted.done == counted.total == 200


async def test_a_failed_calibration_is_shared_within_a_run(tmp_path, caplog):
    source = write_questions(tmp_path / "q.jsonl", 200)
    reads = []
    backends = [
        ScriptedBackend(lambda q: reads.append(q) or [0.0] * len(q.options))
        for _ in range(2)
    ]
    results = await asyncio.gather(
        *(
            calibrated_temperatures(b, settings(tmp_path, source), MODEL)
            for b in backends
        )
    )
    assert [r.server.source for r in results] == ["default", "default"] and len(
        reads
    ) == 200
    assert "failed in another API-server process of this server" in caplog.text


async def test_the_logit_startup_check_runs_once_and_is_adopted(
    tmp_path, smollm2_tokenizer
):
    hosts = [
        TokenizerHost(smollm2_tokenizer, logprob=lambda prompt, token: -0.1)
        for _ in range(2)
    ]
    config = settings(tmp_path, "off")
    backends = [LogitBackend(host, None, config) for host in hosts]
    await asyncio.gather(*(start_backend_once(b, config, MODEL) for b in backends))
    assert sorted(len(h.reads) > 0 for h in hosts) == [False, True], (
        "one process read; the other adopted"
    )
    assert (
        backends[0].catalog == backends[1].catalog
        and backends[0].prompts.enabled == backends[1].prompts.enabled
    )


async def test_another_runs_startup_check_is_not_adopted(
    tmp_path, smollm2_tokenizer, monkeypatch
):
    """A restart, or another server started by the same parent, checks again: the saved check is this
    run's only (pid and start time of the server process)."""
    from vllm.entrypoints.generate.decisions.calibration import deployment_lock

    config = settings(tmp_path, "off")
    first = TokenizerHost(smollm2_tokenizer, logprob=lambda prompt, token: -0.1)
    await start_backend_once(LogitBackend(first, None, config), config, MODEL)
    monkeypatch.setattr(deployment_lock, "_RUN", "another-run")
    second = TokenizerHost(smollm2_tokenizer, logprob=lambda prompt, token: -0.1)
    await start_backend_once(LogitBackend(second, None, config), config, MODEL)
    assert first.reads and second.reads
