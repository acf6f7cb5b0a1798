"""The request body limit and the WebSocket message limit, on ``receive``.

Owns both checks and what a client over a limit gets: a 413 while its body
is read (before anything parses it), or one 413 error event and close 1009
instead of its message. Must not read ahead of the app: nothing is checked
before the route asks for input (authentication comes first).
"""

from __future__ import annotations

import contextlib
import json

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from vllm_omni.errors.http.reporting import details_for_exception
from vllm_omni.errors.http.request_ids import for_this_request, scope_request_id
from vllm_omni.errors.normalizer import Mode
from vllm_omni.errors.render import WS_CLOSE_TOO_BIG, ws_error_event
from vllm_omni.errors.table import HTTP_STATUS_TYPES
from vllm_omni.errors.types import OmniClientError

__all__ = ["limit_body", "limit_messages"]


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


def limit_messages(
    scope: Scope, receive: Receive, send: Send, limit: int, mode: Mode
) -> Receive:
    """``receive`` that answers a client message over ``limit`` bytes itself.

    The message is not handed to the route: the client gets one error
    event (413 ``RequestTooLargeError``, counted as a client error) and a
    close with 1009 (message too big); the route sees a disconnect, as
    for any client that went away, and ends its session.
    """
    closed: Message | None = None

    async def receive_limited() -> Message:
        nonlocal closed
        if closed is not None:
            return closed
        message = await receive()
        if message["type"] != "websocket.receive" or not _over_limit(message, limit):
            return message
        details = details_for_exception(
            _event_too_large(limit),
            request_id=scope_request_id(scope),
            mode=mode,
        )
        event = ws_error_event(for_this_request(details, scope))
        with contextlib.suppress(Exception):  # a client already gone
            await send({"type": "websocket.send", "text": json.dumps(event)})
            await send({"type": "websocket.close", "code": WS_CLOSE_TOO_BIG})
        closed = {"type": "websocket.disconnect", "code": WS_CLOSE_TOO_BIG}
        return closed

    return receive_limited
