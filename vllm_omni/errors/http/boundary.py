"""The HTTP error boundary: one place where every HTTP/WebSocket failure renders.

Layers, outermost first, as Starlette builds them::

    ServerErrorMiddleware   ← our Exception handler: last resort for failures
                              in *other* middlewares (outside the metrics)
    user middleware …       ← Prometheus instrumentator, CORS, …
    ErrorBoundary           ← ours, always the LAST user middleware
    ExceptionMiddleware     ← our framework handlers: 404, 405, validation
    router / routes

Why the order matters: Starlette sends a handler for ``Exception`` to
``ServerErrorMiddleware``, outside every user middleware, so the
instrumentator would record a 500 whatever the client got (vLLM PR #44303).
``ErrorBoundary`` is a pure ASGI callable appended to the *end* of
``app.user_middleware``; ``add_middleware`` inserts at the front, so the
boundary stays innermost whatever is added before or after it, and every
route exception is rendered *inside* the instrumentator, which then records
the status the client really got. Framework errors are raised inside
``ExceptionMiddleware`` and rendered by handlers registered there, also inside.

The boundary owns: request ids (exactly one ``X-Request-Id`` on every HTTP
response and accepted WebSocket handshake, success or error: the client's
when it is a safe token, else a new one; error responses get it from the
renderer, every other response start from the boundary), logging (5xx with
traceback, 4xx at INFO; overload refusals, refusals by a dead engine and
replayed job errors at INFO without traceback), retry guidance for replayed
job errors (``x-should-retry: false``: a repeat reads the same stored
record), legacy-fallback accounting, stage-aware termination on engine
death, the request body limit (413 while the body is read, before anything
parses it), the WebSocket message limit (a 413 error event and close 1009
instead of the message) and client disconnects. The framework handlers put ``Allow`` on
every 405, and the router's default answers an unmatched WebSocket handshake
with the same canonical 404 as HTTP instead of Starlette's bare 403. It
renders only through ``vllm_omni.errors.render``.

Disconnects (DESIGN §9): the boundary owns ``receive``, and when the client
goes away *before the response started* it cancels the route: the engine
stream closes and the request is aborted in every stage, whatever the route
was awaiting (a non-streaming result, the first chunk of a stream, an
upload's body). The route runs in the request's own task; a request still
unanswered after ``WATCH_AFTER_S`` (10 ms) gets a watcher task that reads
the client's messages one ahead of the route (so body limits still stop
reading) and cancels it at once; before that, a disconnect the route reads
itself cancels it, and one it does not read is noticed when the watcher
starts. A request answered within those 10 ms pays no task and no queue
(``docs/performance.md``: the boundary costs a success almost nothing).
A disconnect before the response is logged once
at INFO, counted in ``vllm_omni:aborts_total{reason="client_disconnect"}``,
and answered with status 499 (nginx's "client closed request"), which no
client receives but which keeps ``http_requests_total`` truthful: not a 5xx,
and no entry in ``errors_total``. Mid-stream disconnects are marked with the
same reason and left to the stream, which ends as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, HTTPConnection
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from vllm.exceptions import QueueOverflowError

from vllm_omni.errors.details import DEFAULT_TYPE, STATUS_RANGES, OmniErrorDetails
from vllm_omni.errors.metrics import (
    RAW_FALLBACKS_TOTAL,
    AbortContext,
    record_abort,
    set_abort_context,
)
from vllm_omni.errors.normalizer import Mode, is_legacy_fallback, normalize
from vllm_omni.errors.render import (
    WS_CLOSE_TOO_BIG,
    http_error_response,
    websocket_denial,
    ws_error_event,
)
from vllm_omni.errors.sanitize import (
    sanitize_parameter,
    sanitize_request_id,
    warm_rule_set,
)
from vllm_omni.errors.table import HTTP_STATUS_TYPES, row_for
from vllm_omni.errors.types import (
    EngineDeadError,
    EngineGenerateError,
    OmniClientError,
    OmniServerError,
    VLLMValidationError,
)
from vllm_omni.upstream import terminate_if_errored, warm_launcher

__all__ = [
    "ErrorBoundary",
    "details_for_exception",
    "install_error_handling",
    "replayed",
    "request_id_of",
    "stream_error_details",
]

logger = logging.getLogger("vllm_omni.errors")

_MODES: tuple[Mode, ...] = ("strict", "legacy")
_MAX_VALIDATION_ITEMS = 5
_MAX_FALLBACK_SITES = 4096
# Recorded by the instrumentator for a request whose client went away before
# the response started; never reaches anyone (nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499
_REPLAYED = "_vllm_omni_replayed"
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
_REQUEST_ID = b"x-request-id"
# A request still running after this long, its response not started, gets a
# task that watches for its client leaving (see ``_DisconnectWatch``).
WATCH_AFTER_S = 0.01


def request_id_of(conn: HTTPConnection) -> str:
    """This request's id: the client's ``X-Request-Id`` if it is a safe token,
    else a new one; decided once per request and kept in its scope state."""
    return scope_request_id(conn.scope)


def scope_request_id(scope: Scope) -> str:
    state = scope.setdefault("state", {})
    request_id = state.get("request_id")
    if not isinstance(request_id, str):
        request_id = _incoming_request_id(scope)
        state["request_id"] = request_id
    return request_id


def _new_request_id() -> str:
    # 128 random bits, like uuid4().hex, at a quarter of its cost.
    return os.urandom(16).hex()


def _incoming_request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            accepted = sanitize_request_id(value.decode("latin-1"))
            if accepted is not None:
                scope["state"]["client_request_id"] = True
                return accepted
            break
    return _new_request_id()


def _with_request_id(message: Message, scope: Scope) -> Message:
    """``message`` (a response start) with this request's ``X-Request-Id``,
    unless it already has one (error responses: the renderer put it there)."""
    headers = message.get("headers") or []
    for name, _ in headers:
        if name == _REQUEST_ID:  # ASGI response header names are lowercase
            return message
    request_id = scope_request_id(scope).encode()
    return {**message, "headers": [*headers, (_REQUEST_ID, request_id)]}


def _for_this_request(details: OmniErrorDetails, scope: Scope) -> OmniErrorDetails:
    """The record with the client's ``X-Request-Id``, when the client sent one.

    An exception can bring a record of its own with another id (a stored job
    failure re-raised on download carries the job's); the client's id still
    names the response. Without a client id the record is rendered as it is.
    """
    request_id = scope_request_id(scope)
    if scope["state"].get("client_request_id") and details.request_id != request_id:
        return dataclasses.replace(details, request_id=request_id)
    return details


def _raise_site(exc: BaseException) -> str:
    tb = exc.__traceback__
    if tb is None:
        return "<unknown>"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


class _FallbackLog:
    """Counts legacy fallback hits; logs each raise site once (bounded)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def hit(self, exc: BaseException, details: OmniErrorDetails) -> None:
        label = row_for(type(exc), True).exc_type.__name__
        RAW_FALLBACKS_TOTAL.labels(label).inc()
        site = _raise_site(exc)
        with self._lock:
            if site in self._seen or len(self._seen) >= _MAX_FALLBACK_SITES:
                return
            self._seen.add(site)
        logger.warning(
            "legacy fallback: raw %s raised at %s rendered as %d %s "
            "(request %s); migrate it to a semantic vllm_omni.errors type",
            label,
            site,
            details.status_code,
            details.error_type,
            details.request_id,
        )


_FALLBACKS = _FallbackLog()


def replayed(exc: BaseException) -> BaseException:
    """Mark an exception rebuilt from a stored record (a failed job read back):
    it was logged when it happened, so reading it back logs at INFO, and a
    repeat would read the same record, so its response says
    ``x-should-retry: false``."""
    setattr(exc, _REPLAYED, True)
    return exc


def _is_replayed(exc: BaseException | None) -> bool:
    return exc is not None and getattr(exc, _REPLAYED, False) is True


def _quiet_reason(exc: BaseException | None) -> str | None:
    """Why a server error is expected and logged at INFO without traceback."""
    # The engine hands callers a picklable rebuild of upstream's overload
    # error, with the original as its cause.
    if isinstance(exc, QueueOverflowError) or (
        exc is not None and isinstance(exc.__cause__, QueueOverflowError)
    ):
        return "overload"
    if isinstance(exc, EngineDeadError):
        return "engine dead"  # the death itself was logged once, CRITICAL
    if _is_replayed(exc):
        return "stored job error"
    return None


def _log(exc: BaseException | None, details: OmniErrorDetails) -> None:
    quiet = _quiet_reason(exc) if details.category == "server" else None
    if quiet is not None:
        logger.info(
            "request %s refused with %d %s (%s)",
            details.request_id,
            details.status_code,
            details.error_type,
            quiet,
        )
    elif details.category == "server":
        logger.error(
            "request %s failed with %d %s: %s",
            details.request_id,
            details.status_code,
            details.error_type,
            type(exc).__name__ if exc is not None else "framework error",
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
        )
    else:
        logger.info(
            "request %s rejected with %d %s",
            details.request_id,
            details.status_code,
            details.error_type,
        )


def _terminate_if_errored(
    app: Any, exc: BaseException, details: OmniErrorDetails
) -> None:
    """Stage-aware ``terminate_if_errored``: upstream's rule, our log line.

    Upstream decides (engine state, ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``); the
    log line reports what it decided, naming the stage that died.
    """
    state = getattr(app, "state", None)
    server = getattr(state, "server", None)
    engine = getattr(state, "engine_client", None)
    if engine is None:
        return
    if server is not None and engine.errored:
        # Upstream's rule can only act on a dead engine, so its module (warmed
        # once the server is serving, vllm_omni.upstream) is needed only then.
        terminate_if_errored(server=server, engine=engine)
    if not (isinstance(exc, EngineDeadError) or details.fatal):
        return
    # Once per death: the engine keeps one dead error per death (an engine
    # client without one dies once). The orchestrator logged it CRITICAL.
    death = getattr(engine, "dead_error", None) if engine.errored else None
    key = death if death is not None else engine
    if getattr(state, "reported_death", None) is key:
        return
    state.reported_death = key
    logger.warning(
        "engine dead: stage %s failed fatally (first seen by request %s); %s",
        details.stage_id if details.stage_id is not None else "unknown",
        details.request_id,
        "shutting the API server down"
        if getattr(server, "should_exit", False)
        else "keeping the API server alive",
    )


def details_for_exception(
    exc: BaseException, *, request_id: str | None, mode: Mode = "strict"
) -> OmniErrorDetails:
    """Normalize, then account: fallback counter and log. Never raises."""
    details = normalize(exc, request_id=request_id, mode=mode)
    if mode == "legacy" and is_legacy_fallback(exc):
        _FALLBACKS.hit(exc, details)
    _log(exc, details)
    return details


def stream_error_details(conn: HTTPConnection, exc: BaseException) -> OmniErrorDetails:
    """The record for a failure after headers went out (SSE, WebSocket).

    Same accounting as the boundary (log, fallback counter) and the same
    stage-aware termination on engine death; the caller renders the terminal
    event with ``render.sse_error_events`` / ``render.ws_error_event``.
    """
    mode: Mode = getattr(conn.app.state, "error_mode", "strict")
    details = _for_this_request(
        details_for_exception(exc, request_id=request_id_of(conn), mode=mode),
        conn.scope,
    )
    if isinstance(exc, (EngineDeadError, EngineGenerateError)):
        _terminate_if_errored(conn.app, exc, details)
    return details


def _too_large(limit: int) -> StarletteHTTPException:
    # An HTTPException because FastAPI turns any other exception raised while
    # it reads a body into "400 There was an error parsing the body".
    return StarletteHTTPException(
        413, detail=f"The request body must be at most {limit} bytes."
    )


def _event_too_large(limit: int) -> OmniClientError:
    return OmniClientError(
        f"A WebSocket message must be at most {limit} bytes.",
        status_code=413,
        error_type=HTTP_STATUS_TYPES[413],
    )


def _over_limit(message: Message, limit: int) -> bool:
    """Whether a WebSocket message was larger than ``limit`` bytes as sent."""
    data = message.get("bytes")
    if data is not None:
        return len(data) > limit
    text = message.get("text") or ""
    # A text message travels as UTF-8, 1 to 4 bytes a character: encode only
    # when the count of characters cannot decide.
    if len(text) > limit or len(text) * 4 <= limit:
        return len(text) > limit
    return len(text.encode()) > limit


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def limit_body(scope: Scope, receive: Receive, limit: int) -> Receive:
    """``receive`` that refuses a body past ``limit`` bytes with a 413.

    Checked while the app reads, so nothing happens before the route asks for
    its body (authentication comes first): a declared ``Content-Length`` over
    the limit is refused before a byte is read, a chunked body as soon as the
    running total passes the limit. The rest of the body is never read.
    """
    received = 0

    async def receive_limited() -> Message:
        nonlocal received
        if received == 0:
            declared = _declared_length(scope)
            if declared is not None and declared > limit:
                raise _too_large(limit)
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _too_large(limit)
        return message

    return receive_limited


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
        self._watchlist: _Watchlist | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            if scope["type"] == "lifespan" and not self._warmed:
                # Upstream's launcher module (terminate_if_errored) costs
                # 3-4 s of imports, the sanitizer's rule set a few tenths:
                # load them beside startup, not before it.
                self._warmed = True
                warm_launcher()
                warm_rule_set()
            await self.app(scope, receive, send)
            return
        # Per request (uvicorn runs each in its own task): the engine reads
        # the reason when it aborts.
        context = AbortContext()
        set_abort_context(context)
        if scope["type"] == "websocket":
            ws_send = _websocket_send(send, context)
            ws_receive = _websocket_receive(receive, context)
            if self.max_ws_message_bytes is not None:
                ws_receive = self._limit_messages(scope, ws_receive, ws_send)
            await self._call(scope, ws_receive, ws_send)
            return
        # The route runs in this task; the watch cancels it when the client
        # leaves before the response started (and takes the cancel back).
        task = asyncio.current_task()
        assert task is not None
        watchlist = self._watchlist
        if watchlist is None or watchlist.loop is not task.get_loop():
            watchlist = self._watchlist = _Watchlist(task.get_loop())
        watch = _DisconnectWatch(receive, context, task, watchlist)
        route_receive = watch.receive
        if self.max_request_bytes is not None:
            route_receive = limit_body(scope, route_receive, self.max_request_bytes)
        try:
            await self._call(scope, route_receive, send, watch)
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
            watch.closed_before_start(scope)
            await send(
                {
                    "type": "http.response.start",
                    "status": CLIENT_CLOSED_REQUEST,
                    "headers": [(_REQUEST_ID, scope_request_id(scope).encode())],
                }
            )
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _limit_messages(self, scope: Scope, receive: Receive, send: Send) -> Receive:
        """``receive`` that answers a client message over the limit itself.

        The message is not handed to the route: the client gets one error
        event (413 ``RequestTooLargeError``, counted as a client error) and a
        close with 1009 (message too big); the route sees a disconnect, as
        for any client that went away, and ends its session.
        """
        limit = self.max_ws_message_bytes
        assert limit is not None
        closed: Message | None = None

        async def receive_limited() -> Message:
            nonlocal closed
            if closed is not None:
                return closed
            message = await receive()
            if message["type"] != "websocket.receive" or not _over_limit(
                message, limit
            ):
                return message
            details = details_for_exception(
                _event_too_large(limit),
                request_id=scope_request_id(scope),
                mode=self.mode,
            )
            event = ws_error_event(_for_this_request(details, scope))
            with contextlib.suppress(Exception):  # a client already gone
                await send({"type": "websocket.send", "text": json.dumps(event)})
                await send({"type": "websocket.close", "code": WS_CLOSE_TOO_BIG})
            closed = {"type": "websocket.disconnect", "code": WS_CLOSE_TOO_BIG}
            return closed

        return receive_limited

    async def _call(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        watch: _DisconnectWatch | None = None,
    ) -> None:
        started = False

        async def send_tracked(message: Message) -> None:
            # Notes whether the response has started (and completed, for the
            # watch), and names it: one lookup and one header per response.
            nonlocal started
            if not started and message["type"] in _START_MESSAGES:
                started = True
                if watch is not None:
                    watch.started = True
                if message["type"] in _HEADER_STARTS:
                    message = _with_request_id(message, scope)
            elif (
                watch is not None
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                watch.completed = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except ClientDisconnect:
            # The body could not be read to its end: the client went away
            # (the caller accounts for it). Not an error: nothing to render.
            return
        except Exception as exc:
            details = _for_this_request(
                details_for_exception(
                    exc, request_id=scope_request_id(scope), mode=self.mode
                ),
                scope,
            )
            if isinstance(exc, (EngineDeadError, EngineGenerateError)):
                _terminate_if_errored(scope.get("app"), exc, details)
            if started:
                # Headers are out: a stream must have rendered its own terminal
                # event. All that is left is to end the body cleanly.
                if scope["type"] == "http":
                    await send_tracked(
                        {"type": "http.response.body", "body": b"", "more_body": False}
                    )
                return
            if scope["type"] == "http":
                response = http_error_response(details, replayed=_is_replayed(exc))
                await response(scope, receive, send_tracked)
            else:
                await deny_websocket(scope, send, details)


class _Watchlist:
    """The requests of one event loop that nothing watches yet, oldest first,
    and the one timer that starts their watchers once they are
    ``WATCH_AFTER_S`` old: a dictionary entry per request instead of a timer
    per request, and at most one loop turn per ``WATCH_AFTER_S`` for all."""

    __slots__ = ("_pending", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: dict[_DisconnectWatch, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, watch: _DisconnectWatch) -> None:
        self._pending[watch] = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_later(WATCH_AFTER_S, self._sweep)

    def discard(self, watch: _DisconnectWatch) -> None:
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


class _DisconnectWatch:
    """Owns an HTTP request's ``receive``: notices the client going away.

    Most requests are answered before anyone could notice a hang-up, and a
    watcher task per request would cost them a task, a queue and two
    event-loop turns. So nothing is watched during the first
    ``WATCH_AFTER_S``: the route reads ``receive`` itself, and a disconnect
    it reads cancels it there. After that, unless the response started, a
    watcher task (started by the loop's ``_Watchlist``) reads the client's
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
        watchlist: _Watchlist,
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

    def closed_before_start(self, scope: Scope) -> None:
        """Account for a request whose client left before any response."""
        record_abort("client_disconnect")  # once, even if the engine counted it
        logger.info(
            "request %s: client disconnected before the response started; aborted",
            scope_request_id(scope),
        )


def _websocket_receive(receive: Receive, context: AbortContext) -> Receive:
    """``receive`` that marks the session's aborts as client disconnects once
    the client closed its side."""

    async def marking() -> Message:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            context.reason = "client_disconnect"
        return message

    return marking


def _websocket_send(send: Send, context: AbortContext) -> Send:
    """``send`` that marks the session's aborts as client disconnects when the
    client is gone before it said so (a send to a closed socket fails)."""

    async def marking(message: Message) -> None:
        try:
            await send(message)
        except Exception:
            context.reason = "client_disconnect"
            raise

    return marking


async def deny_websocket(scope: Scope, send: Send, details: OmniErrorDetails) -> None:
    """Refuse a WebSocket handshake with the canonical status and body."""
    denial_with_body = "websocket.http.response" in scope.get("extensions", {})
    for message in websocket_denial(details, with_body=denial_with_body):
        await send(message)


# -- framework errors (inside ExceptionMiddleware) ----------------------------


_DEFAULT_DETAIL = {"client": "Bad Request", "server": "Internal Server Error"}


def _framework_exception(exc: StarletteHTTPException) -> BaseException:
    status = exc.status_code
    for category, wrapper in (("client", OmniClientError), ("server", OmniServerError)):
        if status in STATUS_RANGES[category]:
            detail = exc.detail if isinstance(exc.detail, str) else None
            return wrapper(
                detail or _DEFAULT_DETAIL[category],
                status_code=status,
                error_type=HTTP_STATUS_TYPES.get(status, DEFAULT_TYPE[category]),
            )
    return exc


def _validation_exception(exc: RequestValidationError) -> VLLMValidationError:
    """A 400 that names the first offending field and never echoes input."""
    errors = exc.errors()
    parameter: str | None = None
    parts: list[str] = []
    # A value that matches no member of a union fails once per member
    # (``stop.str``, ``stop.list[str]``): the field is what they share.
    shared = _shared_location(errors) if len(errors) > 1 else []
    if shared:
        parameter = sanitize_parameter(".".join(shared))
    for error in errors[:_MAX_VALIDATION_ITEMS]:
        ctx_error = (error.get("ctx") or {}).get("error")
        if parameter is None and isinstance(ctx_error, VLLMValidationError):
            parameter = ctx_error.parameter
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        # A JSON syntax error's location is a byte offset, not a field.
        field = "body" if error.get("type") == "json_invalid" else ".".join(loc)
        field = field or "body"
        if parameter is None:
            parameter = sanitize_parameter(field)
        parts.append(f"{field}: {error.get('msg', 'invalid value')}")
    if len(errors) > _MAX_VALIDATION_ITEMS:
        parts.append(f"and {len(errors) - _MAX_VALIDATION_ITEMS} more")
    message = "Invalid request: " + "; ".join(parts) if parts else "Invalid request."
    return VLLMValidationError(message, parameter=parameter)


def _shared_location(errors: Sequence[Any]) -> list[str]:
    """The field whose union members all failed: every error's location is
    that field plus one member name; otherwise nothing."""
    locations = [
        tuple(str(p) for p in error.get("loc", ()) if p != "body") for error in errors
    ]
    fields = {location[:-1] for location in locations}
    if len(fields) != 1 or not all(len(location) >= 2 for location in locations):
        return []
    return list(next(iter(fields)))


def _allowed_methods(request: Request) -> str | None:
    """Every method some route accepts on this path, for a 405's ``Allow``.

    Starlette's own 405 names the methods of the first route that matched
    the path only; ``GET`` and ``DELETE`` on one path are two routes.
    """
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods)) or None


def _framework_handler(
    convert: Callable[[Any], BaseException],
) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handle(request: Request, exc: Exception) -> Response:
        mode: Mode = getattr(request.app.state, "error_mode", "strict")
        details = details_for_exception(
            convert(exc), request_id=request_id_of(request), mode=mode
        )
        allow = _allowed_methods(request) if details.status_code == 405 else None
        return http_error_response(details, allow=allow)

    return handle


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """The router's answer when no route matches, on both transports.

    Starlette closes an unmatched WebSocket handshake bare (a 403 with no body,
    no request id, not counted); here it is the same 404 as for HTTP, which
    the boundary renders as a denied handshake.
    """
    not_found = StarletteHTTPException(404)
    if scope["type"] == "websocket":
        raise _framework_exception(not_found)
    raise not_found


async def _outer_safety_net(request: Request, exc: Exception) -> Response:
    """Last resort for failures in middleware outside the boundary."""
    details = details_for_exception(exc, request_id=request_id_of(request))
    return http_error_response(details)


def install_error_handling(
    app: FastAPI,
    *,
    mode: Mode = "strict",
    max_request_bytes: int | None = None,
    max_ws_message_bytes: int | None = None,
) -> None:
    """Install the boundary, the framework handlers and the outer safety net.

    Idempotent. ``mode="legacy"`` enables upstream's raw-exception fallbacks
    (``ValueError``/``TypeError``/``OverflowError`` → 400,
    ``NotImplementedError`` → 501), each hit counted and logged by raise site.
    ``max_request_bytes`` bounds every request body (413 past it),
    ``max_ws_message_bytes`` every WebSocket message (413 event, close 1009).
    """
    if mode not in _MODES:
        raise RuntimeError(f"error mode must be one of {_MODES}, got {mode!r}")
    app.state.error_mode = mode
    app.user_middleware[:] = [
        m for m in app.user_middleware if m.cls is not ErrorBoundary
    ]
    app.user_middleware.append(
        Middleware(
            ErrorBoundary,
            mode=mode,
            max_request_bytes=max_request_bytes,
            max_ws_message_bytes=max_ws_message_bytes,
        )
    )
    app.router.default = _not_found
    app.add_exception_handler(
        StarletteHTTPException, _framework_handler(_framework_exception)
    )
    app.add_exception_handler(
        RequestValidationError, _framework_handler(_validation_exception)
    )
    app.add_exception_handler(Exception, _outer_safety_net)
