"""Startup records handed between processes that share no folder (Ray Data actors on several nodes):
the board's take and give (bulk/ray_data.Board, run here as a plain object), and once_per_server
taking a record from it, or making one and giving it, failures included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from vllm.entrypoints.generate.decisions.bulk.ray_data import Board
from vllm.entrypoints.generate.decisions.calibration import deployment_lock
from vllm.entrypoints.generate.decisions.calibration.deployment_lock import (
    once_per_server,
    share_records,
)

KEY = {"model": "m"}


async def test_the_first_to_ask_makes_the_record_and_the_others_wait_for_it():
    board = Board()
    assert await board.take("r", 30) is None  # the first: make it
    waiting = [asyncio.ensure_future(board.take("r", 30)) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiting)
    await board.give("r", {"t": 1.5})
    assert await asyncio.gather(*waiting) == [{"t": 1.5}, {"t": 1.5}]
    assert await board.take("r", 30) == {"t": 1.5}  # later askers get it at once
    assert [board.join(), board.join()] == [0, 1]
    assert board.report() == {"actors_started": 2, "made": {"r": 1}}


async def test_a_failed_maker_hands_the_work_to_one_waiter():
    board = Board()
    assert await board.take("r", 30) is None
    first, second = (
        asyncio.ensure_future(board.take("r", 30)),
        asyncio.ensure_future(board.take("r", 30)),
    )
    await asyncio.sleep(0.05)
    await board.give("r", None)  # making it failed
    done, pending = await asyncio.wait({first, second}, timeout=0.5)
    assert [task.result() for task in done] == [None] and len(
        pending
    ) == 1  # one makes it, one waits on
    await board.give("r", {"t": 2.0})
    assert await pending.pop() == {"t": 2.0}


async def test_a_stuck_maker_is_waited_for_only_so_long():
    board = Board()
    assert await board.take("r", 30) is None
    assert await board.take("r", 0.1) is None  # gave up waiting: make it too


class Shared:
    """deployment_lock.SharedRecords over a Board, as the actors' BoardRecords is over the actor."""

    def __init__(self, board: Board) -> None:
        self.board, self.given = board, []

    async def take(self, name: str, wait_s: float):
        return await self.board.take(name, wait_s)

    async def give(self, name: str, record):
        self.given.append(record)
        await self.board.give(name, record)


@pytest.fixture
def shared():
    board = Shared(Board())
    share_records(board)
    yield board
    share_records(None)


async def test_one_process_makes_the_record_and_another_with_its_own_folder_takes_it(
    tmp_path, shared
):
    made = []

    async def produce(name: str) -> dict:
        made.append(name)
        await asyncio.sleep(0.2)
        return {"t": 1.25}

    def node(n: int) -> Path:
        return tmp_path / f"node-{n}"

    results = await asyncio.gather(
        *(
            once_per_server(
                node(n),
                KEY,
                "calibration",
                30,
                lambda n=n: produce(f"node-{n}"),
                lambda saved: True,
            )
            for n in range(2)
        )
    )
    assert len(made) == 1 and shared.given == [{"t": 1.25}]
    assert sorted(loaded for _, loaded in results) == [False, True]
    assert all(record == {"t": 1.25} for record, _ in results)
    # each folder holds the record, so a restart on that node loads it from disk
    for n in range(2):
        assert deployment_lock.load(node(n), KEY, "calibration")["t"] == 1.25


async def test_a_record_the_caller_cant_reuse_is_made_again(tmp_path, shared):
    await shared.board.take(deployment_lock.path_for(tmp_path, KEY, "startup").stem, 30)
    await shared.board.give(
        deployment_lock.path_for(tmp_path, KEY, "startup").stem, {"run": "another run"}
    )

    async def produce() -> dict:
        return {"run": "this run"}

    record, loaded = await once_per_server(
        tmp_path, KEY, "startup", 30, produce, lambda saved: saved["run"] == "this run"
    )
    assert record == {"run": "this run"} and not loaded


async def test_a_maker_that_raises_gives_the_work_up(tmp_path, shared):
    async def produce() -> dict:
        raise RuntimeError("engine gone")

    with pytest.raises(RuntimeError, match="engine gone"):
        await once_per_server(
            tmp_path, KEY, "calibration", 30, produce, lambda saved: True
        )
    assert shared.given == [None]
    # free to make
    assert (
        await shared.board.take(
            deployment_lock.path_for(tmp_path, KEY, "calibration").stem, 30
        )
        is None
    )


def test_a_named_run_is_kept_by_the_servers_run_naming():
    saved = deployment_lock._RUN, deployment_lock._NAMED
    try:
        deployment_lock.name_run("ray-stage-x")
        deployment_lock.identify_run(None)  # what build_service does in each actor
        assert deployment_lock.run_id() == "ray-stage-x"
    finally:
        deployment_lock._RUN, deployment_lock._NAMED = saved
