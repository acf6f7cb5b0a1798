"""The engine process counts one abort per request an API server closes.

With several API server processes (issue 46), the route's process posts
``generate`` and, when its client leaves, ``close`` with the transport's
reason, and leaves the count to the engine process. Seen in a 10-minute
soak at N=2: one ``client_disconnect`` abort short of the hang-ups. When a
client leaves as its route posts the request, both messages arrive in one
read: the request's task was cancelled before it ran, the engine never saw
the request, and nobody counted it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from vllm_omni.entrypoints.engine_rpc.server import EngineServer
from vllm_omni.errors.metrics import ABORTS_TOTAL, record_abort

CLIENT = b"api-server-0"


class _HangingEngine:
    """``generate`` holds the request until it is cancelled, then counts the
    abort as the orchestrator does (``record_abort("cancelled")``)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def generate(self, prompt: str, *_: Any, **__: Any) -> AsyncIterator[Any]:
        self.seen.append(prompt)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            record_abort("cancelled")
            raise
        yield None


def _disconnects() -> float:
    return ABORTS_TOTAL.labels("client_disconnect")._value.get()


async def _settled(server: EngineServer) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    assert not server._streams


@pytest.fixture
def served() -> Iterator[tuple[EngineServer, _HangingEngine]]:
    engine = _HangingEngine()
    server = EngineServer(engine, None, "inproc://unused")  # type: ignore[arg-type]
    yield server, engine
    server._socket.socket.close(linger=0)


async def test_a_request_closed_before_its_task_ran_counts_once(
    served: tuple[EngineServer, _HangingEngine],
) -> None:
    server, engine = served
    before = _disconnects()
    server._generate(CLIENT, 1, ("cut at once",), {})
    server._close(CLIENT, 1, "client_disconnect")
    await _settled(server)
    assert engine.seen == []
    assert _disconnects() - before == 1


async def test_a_request_closed_in_the_engine_counts_once(
    served: tuple[EngineServer, _HangingEngine],
) -> None:
    server, engine = served
    before = _disconnects()
    server._generate(CLIENT, 2, ("cut later",), {})
    for _ in range(3):
        await asyncio.sleep(0)
    assert engine.seen == ["cut later"]
    server._close(CLIENT, 2, "client_disconnect")
    await _settled(server)
    assert _disconnects() - before == 1
