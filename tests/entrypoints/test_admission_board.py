"""The admission board several API server processes read (issue 46).

The engine process writes its requests in flight, each API server process
the places its routes hold for requests on their way to the engine; every
process reads the sum, so the early check of one process counts what the
others let through. Each word has one writer; a fork shares the page.
"""

from __future__ import annotations

import os

import pytest
from vllm.exceptions import QueueOverflowError

from vllm_omni.config import load_pipeline
from vllm_omni.entrypoints.engine_rpc.board import AdmissionBoard
from vllm_omni.entrypoints.engine_rpc.client import EngineClient
from vllm_omni.entrypoints.engine_rpc.protocol import EngineInfo


def test_the_board_sums_the_engine_and_every_process() -> None:
    board = AdmissionBoard(api_servers=2)
    assert board.get() == 0
    board.set(5)
    board.hold(0, 2)
    board.hold(1, 3)
    assert board.get() == 10
    board.hold(0, 0)
    board.set(1)
    assert board.get() == 4


def test_a_forked_process_writes_its_own_word() -> None:
    board = AdmissionBoard(api_servers=2)
    board.set(1)
    pid = os.fork()
    if pid == 0:  # the API server process 1
        board.hold(1, 7)
        os._exit(0 if board.get() == 8 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert board.get() == 8


def test_places_held_in_one_process_count_in_every_process() -> None:
    """Two API server processes' clients on one board (as after the fork):
    the places one holds refuse the other's requests at the limit, and
    come back when released."""
    board = AdmissionBoard(api_servers=2)
    clients = [EngineClient("ipc:///nonexistent", board, index) for index in (0, 1)]
    for client in clients:
        # What the engine process answers to the client's hello.
        client._info = EngineInfo(
            config=load_pipeline("reference"),
            modalities=frozenset({"text"}),
            stages_for={},
            voices=[],
            max_num_queued_reqs=3,
            retention_s=None,
            pid=os.getpid(),
        )
    try:
        with clients[0].hold_admission("a"), clients[0].hold_admission("b"):
            board.set(1)
            assert board.get() == 3
            with pytest.raises(QueueOverflowError):
                clients[1].hold_admission("c")
            board.set(0)
            with clients[1].hold_admission("c"):
                assert board.get() == 3
        assert board.get() == 0
    finally:
        for client in clients:
            client.shutdown()
