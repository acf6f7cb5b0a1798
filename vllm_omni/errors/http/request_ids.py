"""The request id: one per request, decided once, on every response.

Owns the choice (the client's ``X-Request-Id`` when it is a safe token, else
a new one), where it is kept (the scope's state) and the one header on a
response start. Must not render or log: it only names.
"""

from __future__ import annotations

import dataclasses
import os

from starlette.requests import HTTPConnection
from starlette.types import Message, Scope

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.sanitize import sanitize_request_id

__all__ = [
    "ASGI_REQUEST_ID_HEADER",
    "for_this_request",
    "request_id_of",
    "scope_request_id",
    "with_request_id",
]

# ``X-Request-Id`` as ASGI names it: lowercase bytes
# (``vllm_omni.errors.render.REQUEST_ID_HEADER`` for Starlette responses).
ASGI_REQUEST_ID_HEADER = b"x-request-id"


def request_id_of(conn: HTTPConnection) -> str:
    """This request's id: the client's ``X-Request-Id`` if it is a safe token,
    else a new one; decided once per request and kept in its scope state."""
    return scope_request_id(conn.scope)


def scope_request_id(scope: Scope) -> str:
    """``request_id_of`` for a bare ASGI scope."""
    state = scope.setdefault("state", {})
    request_id = state.get("request_id")
    if not isinstance(request_id, str):
        request_id = _incoming_request_id(scope)
        state["request_id"] = request_id
    return request_id


# Fresh ids are cut from one ``os.urandom`` call per this many requests:
# 128 random bits each, like uuid4().hex, without a system call per request.
_IDS_PER_DRAW = 256
_fresh_ids: list[str] = []
# A forked child must not hand out its parent's ids.
os.register_at_fork(after_in_child=_fresh_ids.clear)


def _new_request_id() -> str:
    try:
        return _fresh_ids.pop()
    except IndexError:
        pool = os.urandom(16 * _IDS_PER_DRAW).hex()
        _fresh_ids.extend(pool[i : i + 32] for i in range(0, len(pool), 32))
        return _fresh_ids.pop()


def _incoming_request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == ASGI_REQUEST_ID_HEADER:
            accepted = sanitize_request_id(value.decode("latin-1"))
            if accepted is not None:
                scope["state"]["client_request_id"] = True
                return accepted
            break
    return _new_request_id()


def with_request_id(message: Message, scope: Scope) -> Message:
    """``message`` (a response start) with this request's ``X-Request-Id``,
    unless it already has one (error responses: the renderer put it there)."""
    headers = message.get("headers") or []
    for name, _ in headers:
        if name == ASGI_REQUEST_ID_HEADER:
            return message
    request_id = scope_request_id(scope).encode()
    return {**message, "headers": [*headers, (ASGI_REQUEST_ID_HEADER, request_id)]}


def for_this_request(details: OmniErrorDetails, scope: Scope) -> OmniErrorDetails:
    """The record with the client's ``X-Request-Id``, when the client sent one.

    An exception can bring a record of its own with another id (a stored job
    failure re-raised on download carries the job's); the client's id still
    names the response. Without a client id the record is rendered as it is.
    """
    request_id = scope_request_id(scope)
    if scope["state"].get("client_request_id") and details.request_id != request_id:
        return dataclasses.replace(details, request_id=request_id)
    return details
