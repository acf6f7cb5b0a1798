"""The error boundary: the pure ASGI middleware every request goes through.

Owns the request's edges: it renders any exception a route lets escape
(before the response started; after, it only ends the body), puts the
request id on every response start, and wires in the body and WebSocket
message limits, the disconnect watch and the WebSocket markers. It must stay
the innermost user middleware (``register``; the server appends one inside
it, its admission gate, which only raises) and render only through
``vllm_omni.errors.render``. Why: docs/design.md §4.1, §9.
"""

from __future__ import annotations

import asyncio
from asyncio import current_task

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_omni.errors.http.disconnects import DisconnectWatch, Watchlist
from vllm_omni.errors.http.failures import failure_details
from vllm_omni.errors.http.limits import limit_body, limit_messages
from vllm_omni.errors.http.reporting import is_replayed
from vllm_omni.errors.http.request_ids import with_request_id
from vllm_omni.errors.http.websocket import (
    deny_websocket,
    websocket_receive,
    websocket_send,
)
from vllm_omni.errors.metrics import AbortContext, set_abort_context
from vllm_omni.errors.normalizer import Mode
from vllm_omni.errors.render import http_error_response
from vllm_omni.errors.sanitize import warm_rule_set
from vllm_omni.upstream import warm_launcher

__all__ = ["ErrorBoundary"]

# ASGI messages after which the response (or handshake) can no longer change.
_START_MESSAGES = frozenset(
    {
        "http.response.start",
        "websocket.accept",
        "websocket.close",
        "websocket.http.response.start",
    }
)
# Start messages that carry response headers (a close frame has none).
_HEADER_STARTS = _START_MESSAGES - {"websocket.close"}


class ErrorBoundary:
    """Pure ASGI middleware: render any escaping exception as the canonical error.

    With ``max_request_bytes`` it also bounds every request body (413); with
    ``max_ws_message_bytes`` every WebSocket message a client sends (an error
    event, 413, then close 1009).
    """

    def __init__(
        self,
        app: ASGIApp,
        mode: Mode = "strict",
        max_request_bytes: int | None = None,
        max_ws_message_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.mode = mode
        self.max_request_bytes = max_request_bytes
        self.max_ws_message_bytes = max_ws_message_bytes
        self._warmed = False
        # Requests not watched yet, on the loop that serves them.
        self._watchlist: Watchlist | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._other(scope, receive, send)
            return
        # Per request (uvicorn runs each in its own task): the engine reads
        # the reason when it aborts.
        context = AbortContext()
        set_abort_context(context)
        # The route runs in this task; the watch cancels it when the client
        # leaves before the response started (and takes the cancel back).
        task = current_task()
        assert task is not None
        watchlist = self._watchlist
        if watchlist is None or watchlist.loop is not task.get_loop():
            watchlist = self._watchlist = Watchlist(task.get_loop())
        watch = DisconnectWatch(receive, context, task, watchlist)
        route_receive = watch.receive
        if self.max_request_bytes is not None:
            route_receive = limit_body(scope, route_receive, self.max_request_bytes)

        async def send_tracked(message: Message) -> None:
            # Notes the response's start (named: one lookup, one header) and
            # its end for the watch; nothing else per body chunk.
            if not watch.started and message["type"] == "http.response.start":
                watch.started = True
                message = with_request_id(message, scope)
            elif message["type"] == "http.response.body" and not message.get(
                "more_body", False
            ):
                watch.completed = True
            await send(message)

        try:
            try:
                await self.app(scope, route_receive, send_tracked)
            except ClientDisconnect:
                # The body could not be read to its end: the client went
                # away (accounted below). Not an error: nothing to render.
                pass
            except Exception as exc:
                await self._failed(
                    exc, scope, route_receive, send_tracked, watch.started
                )
        except asyncio.CancelledError:
            if not watch.cancelled_route:
                raise  # the server is stopping, not the client
        finally:
            watch.forget()
            if watch.cancelled_task:
                task.uncancel()
            if watch.watching:
                await watch.stop()
        if watch.disconnected and not watch.started:
            await watch.closed_before_start(scope, send)

    async def _other(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket session, or anything that is not a request (lifespan)."""
        if scope["type"] != "websocket":
            if scope["type"] == "lifespan" and not self._warmed:
                # Upstream's launcher module (terminate_if_errored) costs
                # 3-4 s of imports, the sanitizer's rule set a few tenths:
                # load them beside startup, not before it.
                self._warmed = True
                warm_launcher()
                warm_rule_set()
            await self.app(scope, receive, send)
            return
        context = AbortContext()
        set_abort_context(context)
        ws_send = websocket_send(send, context)
        ws_receive = websocket_receive(receive, context)
        if self.max_ws_message_bytes is not None:
            ws_receive = limit_messages(
                scope, ws_receive, ws_send, self.max_ws_message_bytes, self.mode
            )
        started = False

        async def send_tracked(message: Message) -> None:
            # Notes whether the handshake was answered, and names the answer.
            nonlocal started
            if not started and message["type"] in _START_MESSAGES:
                started = True
                if message["type"] in _HEADER_STARTS:
                    message = with_request_id(message, scope)
            await ws_send(message)

        try:
            await self.app(scope, ws_receive, send_tracked)
        except ClientDisconnect:
            return
        except Exception as exc:
            await self._failed(exc, scope, ws_receive, send, started)

    async def _failed(
        self,
        exc: Exception,
        scope: Scope,
        receive: Receive,
        send: Send,
        started: bool,
    ) -> None:
        """Account for ``exc`` and answer with the canonical error, or, when
        the response already started, end it (``send``: the tracked one for
        HTTP, the client's own for a WebSocket denial)."""
        details = failure_details(exc, scope, app=scope.get("app"), mode=self.mode)
        if started:
            # Headers are out: a stream must have rendered its own terminal
            # event. All that is left is to end the body cleanly.
            if scope["type"] == "http":
                await send(
                    {"type": "http.response.body", "body": b"", "more_body": False}
                )
            return
        if scope["type"] == "http":
            response = http_error_response(details, replayed=is_replayed(exc))
            await response(scope, receive, send)
        else:
            await deny_websocket(scope, send, details)
