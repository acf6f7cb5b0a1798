"""The disconnect watch: a client that leaves before its response cancels it.

Owns noticing an HTTP client's leaving before the response started,
cancelling the route (the engine stream closes, the request is aborted in
every stage), counting and logging it once, and the 499 the instrumentator
records for it. A request answered within ``WATCH_AFTER_S`` pays no task and
no queue. Must not touch a response that started: a mid-stream disconnect
is only marked, and the stream ends as before. Why: docs/design.md §9.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from vllm_omni.errors.http.request_ids import ASGI_REQUEST_ID_HEADER, scope_request_id
from vllm_omni.errors.metrics import AbortContext, record_abort

__all__ = ["CLIENT_CLOSED_REQUEST", "WATCH_AFTER_S", "DisconnectWatch", "Watchlist"]

logger = logging.getLogger("vllm_omni.errors")

# Recorded by the instrumentator for a request whose client went away before
# the response started; never reaches anyone (nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499
# A request still running after this long, its response not started, gets a
# task that watches for its client leaving (see ``DisconnectWatch``).
WATCH_AFTER_S = 0.01


class Watchlist:
    """The requests of one event loop that nothing watches yet, oldest first,
    and the one timer that starts their watchers once they are
    ``WATCH_AFTER_S`` old: a dictionary entry per request instead of a timer
    per request, and at most one loop turn per ``WATCH_AFTER_S`` for all."""

    __slots__ = ("_pending", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: dict[DisconnectWatch, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, watch: DisconnectWatch) -> None:
        self._pending[watch] = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_later(WATCH_AFTER_S, self._sweep)

    def discard(self, watch: DisconnectWatch) -> None:
        self._pending.pop(watch, None)

    def _sweep(self) -> None:
        self._timer = None
        due = self.loop.time() - WATCH_AFTER_S
        while self._pending:
            watch, since = next(iter(self._pending.items()))
            if since > due:
                self._timer = self.loop.call_at(since + WATCH_AFTER_S, self._sweep)
                return
            del self._pending[watch]
            watch.start()


class DisconnectWatch:
    """Owns an HTTP request's ``receive``: notices the client going away.

    Most requests are answered before anyone could notice a hang-up, and a
    watcher task per request would cost them a task, a queue and two
    event-loop turns. So nothing is watched during the first
    ``WATCH_AFTER_S``: the route reads ``receive`` itself, and a disconnect
    it reads cancels it there. After that, unless the response started, a
    watcher task (started by the loop's ``Watchlist``) reads the client's
    messages one ahead of the route (body limits downstream still apply) and
    cancels the route's task the moment the client goes away, whatever the
    route awaits. A client that left in the first ``WATCH_AFTER_S`` is
    noticed when the watcher starts.
    """

    __slots__ = (
        "_context",
        "_due",
        "_inbox",
        "_reading",
        "_receive",
        "_route",
        "_task",
        "_watchlist",
        "cancelled_route",
        "cancelled_task",
        "completed",
        "disconnected",
        "route_done",
        "started",
    )

    def __init__(
        self,
        receive: Receive,
        context: AbortContext,
        route: asyncio.Task[Any],
        watchlist: Watchlist,
    ) -> None:
        self._receive = receive
        self._context = context
        self._route = route
        self._inbox: asyncio.Queue[Message] | None = None
        self._task: asyncio.Task[None] | None = None
        # The route is inside ``receive`` itself: the watcher starts after.
        self._reading = False
        self._due = False
        self._watchlist = watchlist
        watchlist.add(self)
        self.started = False
        self.completed = False
        self.disconnected = False
        self.cancelled_route = False
        # The route's task was cancelled from the watcher (to be taken back).
        self.cancelled_task = False
        self.route_done = False

    def start(self) -> None:
        """Watch from now on (the route is not reading: else after its read)."""
        if self.route_done or self.started or self._task is not None:
            return
        if self._reading:
            self._due = True
            return
        self._inbox = asyncio.Queue(maxsize=1)
        self._task = self._watchlist.loop.create_task(self._watch())

    @property
    def watching(self) -> bool:
        return self._task is not None

    def forget(self) -> None:
        """The route is done: no watcher is started for it any more."""
        self.route_done = True
        self._watchlist.discard(self)

    async def stop(self) -> None:
        """End the watcher task, if one was started."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def receive(self) -> Message:
        if self._inbox is None:
            self._reading = True
            try:
                message = await self._receive()
            finally:
                self._reading = False
            if message["type"] == "http.disconnect":
                self.disconnected = True
                if self._on_disconnect(cancel=False):
                    # The route must not see it: it would answer with an
                    # error nobody receives (FastAPI: 400 for a cut body).
                    raise asyncio.CancelledError
            elif self._due:
                self.start()
            return message
        if self.disconnected and self._inbox.empty():
            return {"type": "http.disconnect"}
        return await self._inbox.get()

    async def _watch(self) -> None:
        assert self._inbox is not None
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._on_disconnect(cancel=True)
                self.disconnected = True
                await self._inbox.put(message)
                return
            await self._inbox.put(message)

    def _on_disconnect(self, *, cancel: bool) -> bool:
        """Account for the client's leaving; whether the route is cancelled
        (before its response started; ``cancel``: from the watcher task)."""
        if self.completed:
            return False  # after the response completed, just the end of it
        self._context.reason = "client_disconnect"
        if self.started or self.route_done:
            return False
        self.cancelled_route = True
        if cancel:
            self.cancelled_task = True
            self._route.cancel()
        return True

    async def closed_before_start(self, scope: Scope, send: Send) -> None:
        """Account for a request whose client left before any response, and
        answer it with 499 for the instrumentator (no client receives it)."""
        record_abort("client_disconnect")  # once, even if the engine counted it
        request_id = scope_request_id(scope)
        logger.info(
            "request %s: client disconnected before the response started; aborted",
            request_id,
        )
        await send(
            {
                "type": "http.response.start",
                "status": CLIENT_CLOSED_REQUEST,
                "headers": [(ASGI_REQUEST_ID_HEADER, request_id.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
