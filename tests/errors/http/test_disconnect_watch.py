"""The disconnect watch (``disconnects``): a client that leaves before its
response started cancels the route, whatever the route awaits, and the
request ends as a 499 counted once as a client disconnect; a request
answered in time runs in its own task and nothing reads ahead of it; a
client that leaves mid-stream is only marked."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import REGISTRY
from starlette.types import Receive, Scope, Send

from tests.errors.http.asgi_calls import Client, call, http_scope
from vllm_omni.errors.http import ErrorBoundary
from vllm_omni.errors.http.disconnects import CLIENT_CLOSED_REQUEST, WATCH_AFTER_S
from vllm_omni.errors.metrics import abort_context

BODY = {"type": "http.request", "body": b"{}", "more_body": False}
GONE = {"type": "http.disconnect"}
LATER = WATCH_AFTER_S * 5


def _client_disconnects() -> float:
    value = REGISTRY.get_sample_value(
        "vllm_omni:aborts_total", {"reason": "client_disconnect"}
    )
    assert value is not None
    return value


class Route:
    """What the route did: cancelled or not, in which task, what it read."""

    def __init__(self) -> None:
        self.cancelled = False
        self.task: asyncio.Task[object] | None = None
        self.read: list[str] = []

    async def _answer(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def waits_for_the_engine(
        self, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            await asyncio.Event().wait()  # a result that never comes
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def reads_its_body_twice(
        self, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            for _ in range(2):
                self.read.append((await receive())["type"])
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        await self._answer(send)

    async def answers_at_once(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.task = asyncio.current_task()
        await self._answer(send)

    async def answers_late(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(LATER)
        await self._answer(send)

    async def streams(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        self.read.append((await receive())["type"])
        context = abort_context()
        assert context is not None
        self.read.append(str(context.reason))
        await send({"type": "http.response.body", "body": b""})


def _rid(name: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-request-id", name.encode())]


def _assert_closed_before_start(client: Client, rid: str) -> None:
    start, end = client.sent
    assert start == {
        "type": "http.response.start",
        "status": CLIENT_CLOSED_REQUEST,
        "headers": [(b"x-request-id", rid.encode())],
    }
    assert end == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_a_client_that_leaves_cancels_a_route_awaiting_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    route = Route()
    client = Client([BODY, LATER, GONE])
    before = _client_disconnects()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.INFO, logger="vllm_omni.errors"):
        await call(
            ErrorBoundary(route.waits_for_the_engine),
            http_scope(headers=_rid("gone-1")),
            client,
        )
    # Cancelled by the watch the moment the client left, not by a timeout.
    assert loop.time() - started < LATER + 1.0
    assert route.cancelled
    _assert_closed_before_start(client, "gone-1")
    assert _client_disconnects() == before + 1
    lines = [r.getMessage() for r in caplog.records if "gone-1" in r.getMessage()]
    assert lines == [
        "request gone-1: client disconnected before the response started; aborted"
    ]
    assert [r.levelno for r in caplog.records if "gone-1" in r.getMessage()] == [
        logging.INFO
    ]
    assert client.waiting == 0  # the watcher ended with the request


async def test_a_disconnect_the_route_reads_itself_cancels_it_at_once() -> None:
    route = Route()
    client = Client([BODY, GONE])
    before = _client_disconnects()
    started = asyncio.get_running_loop().time()
    await call(
        ErrorBoundary(route.reads_its_body_twice),
        http_scope(headers=_rid("gone-2")),
        client,
    )
    # The route never sees the disconnect: it would answer a 400 to nobody.
    assert route.read == ["http.request"]
    assert route.cancelled
    assert asyncio.get_running_loop().time() - started < 1.0
    _assert_closed_before_start(client, "gone-2")
    assert _client_disconnects() == before + 1


async def test_a_request_answered_in_time_pays_no_task_and_no_read_ahead() -> None:
    route = Route()
    client = Client([BODY])
    boundary = ErrorBoundary(route.answers_at_once)
    request = asyncio.create_task(boundary(http_scope(), client.receive, client.send))
    await request
    assert route.task is request  # the request's task: none of its own
    assert client.received == 0  # nothing read the body for it
    assert client.status == 200


async def test_a_slow_request_whose_client_stays_is_not_cancelled() -> None:
    route = Route()
    client = Client([BODY])
    before = _client_disconnects()
    await call(ErrorBoundary(route.answers_late), http_scope(), client)
    assert client.status == 200
    assert client.received == 2  # the watcher read one ahead, then waited
    assert client.waiting == 0  # and was stopped with the request
    assert _client_disconnects() == before


async def test_a_client_that_leaves_mid_stream_is_only_marked() -> None:
    route = Route()
    client = Client([GONE])
    before = _client_disconnects()
    await call(ErrorBoundary(route.streams), http_scope(), client)
    assert route.read == ["http.disconnect", "client_disconnect"]
    assert not route.cancelled
    assert client.status == 200
    assert [m["type"] for m in client.sent] == [
        "http.response.start",
        "http.response.body",
        "http.response.body",
    ]
    assert _client_disconnects() == before  # the stream's abort counts it
