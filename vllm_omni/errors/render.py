"""The renderers: one record → the canonical error object on every transport.

This is the only module that builds the OpenAI-style envelope
``{"error": {"message", "type", "param", "code", "request_id"?, "stage_id"?}}``
(docs/design.md §4). Each transport has one function here, and each counts the error
it renders in ``vllm_omni:errors_total``. Renderers read only the record: they
never see the exception, so nothing the normalizer dropped can come back.

It also owns the retry guidance (docs/design.md §10): ``should_retry`` decides from
the record alone (owner, status, fatality) whether repeating the request can
help. HTTP responses carry the decision as ``x-should-retry`` (the header the
OpenAI and Anthropic SDKs obey before their own status rules) with
``Retry-After`` when it is ``true``; where no header can be read (an SSE
error event after 200, a WebSocket error event, a stored job error) the
error object carries it as ``retryable``. No route sets either.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import Transport, record_error

__all__ = [
    "REQUEST_ID_HEADER",
    "RETRY_AFTER_HEADER",
    "RETRY_AFTER_S",
    "SHOULD_RETRY_HEADER",
    "WS_CLOSE_TOO_BIG",
    "error_body",
    "error_object",
    "http_error_response",
    "job_error",
    "retry_headers",
    "should_retry",
    "sse_error_events",
    "websocket_denial",
    "ws_close_code",
    "ws_error_event",
]

REQUEST_ID_HEADER = "X-Request-Id"
# The OpenAI and Anthropic SDKs read this before their own rule (retry 408,
# 409, 429 and every 5xx): "true" or "false" overrides it.
SHOULD_RETRY_HEADER = "x-should-retry"
# Every retryable error says when (RFC 9110 §10.2.3), as upstream's
# QueueOverflowError asks clients to retry; the SDKs wait that long instead
# of their own backoff.
RETRY_AFTER_HEADER = "Retry-After"
RETRY_AFTER_S = 1

# Client errors a repeat of the same request can get past: it arrived too
# slowly (408) or too soon (429). Every other client error is answered the
# same way again.
_RETRYABLE_CLIENT_STATUSES = frozenset({408, 429})
# Server errors no repeat can change: the server does not implement it.
_FINAL_SERVER_STATUSES = frozenset({501})

# WebSocket close codes (RFC 6455 §7.4.1): policy violation for client
# errors, internal error for server errors, try again later for 503.
_WS_CLOSE_CLIENT = 1008
_WS_CLOSE_SERVER = 1011
_WS_CLOSE_TRY_AGAIN = 1013
# After the error event for a client message over the size limit.
WS_CLOSE_TOO_BIG = 1009


def error_object(details: OmniErrorDetails) -> dict[str, Any]:
    """The inner canonical error object; ``code`` is the status."""
    obj: dict[str, Any] = {
        "message": details.message,
        "type": details.error_type,
        "param": details.parameter,
        "code": details.status_code,
    }
    if details.request_id is not None:
        obj["request_id"] = details.request_id
    if details.stage_id is not None:
        obj["stage_id"] = details.stage_id
        # 0.30's name, kept for one release (docs/errors/stages.md).
        obj["error_stage_id"] = details.stage_id
    return obj


def error_body(details: OmniErrorDetails) -> dict[str, Any]:
    """The envelope: ``{"error": error_object}``."""
    return {"error": error_object(details)}


def should_retry(details: OmniErrorDetails) -> bool:
    """Whether repeating the same request can succeed, from the record alone.

    Client errors: no, except 408 and 429. Server errors: no for a dead
    engine (``fatal``: it is terminating, or kept alive dead) and for 501;
    yes for the rest (503 overload or drained stage, 504 stage deadline, and a
    nonfatal 500: one request failed in a stage that keeps serving, as the
    SDKs assume for every 5xx).
    """
    if details.category == "client":
        return details.status_code in _RETRYABLE_CLIENT_STATUSES
    return not details.fatal and details.status_code not in _FINAL_SERVER_STATUSES


def retry_headers(
    details: OmniErrorDetails, *, replayed: bool = False
) -> list[tuple[str, str]]:
    """``x-should-retry``, and ``Retry-After`` when it is ``true``: the
    record's ``retry_after_s``, else ``RETRY_AFTER_S``.

    ``replayed``: the response repeats a stored outcome (a failed job's
    content), which a repeat of the request would only repeat again.
    """
    if replayed or not should_retry(details):
        return [(SHOULD_RETRY_HEADER, "false")]
    # A record may say how long to wait (a faulted stage's recovery window).
    wait = details.retry_after_s or RETRY_AFTER_S
    return [(SHOULD_RETRY_HEADER, "true"), (RETRY_AFTER_HEADER, str(wait))]


def _with_retry(details: OmniErrorDetails) -> dict[str, Any]:
    """The error object plus ``retryable``, for transports without headers."""
    obj = error_object(details)
    obj["retryable"] = should_retry(details)
    return obj


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def http_error_response(
    details: OmniErrorDetails,
    *,
    transport: Transport = "http",
    allow: str | None = None,
    replayed: bool = False,
) -> Response:
    """An HTTP response whose status always equals ``error.code``.

    ``allow`` is the ``Allow`` header a 405 must carry (RFC 9110 §15.5.6);
    ``replayed`` marks a stored outcome (``retry_headers``).
    """
    record_error(transport, details)
    headers = dict(retry_headers(details, replayed=replayed))
    if details.request_id:
        headers[REQUEST_ID_HEADER] = details.request_id
    if allow is not None:
        headers["Allow"] = allow
    return Response(
        _json(error_body(details)),
        status_code=details.status_code,
        headers=headers,
        media_type="application/json",
    )


def sse_error_events(details: OmniErrorDetails) -> bytes:
    """The terminal frames of a stream that already sent 200: error, then DONE.

    The 200's headers went out before the error: ``retryable`` says it.
    """
    record_error("sse", details)
    body = {"error": _with_retry(details)}
    return b"data: " + _json(body) + b"\n\ndata: [DONE]\n\n"


def ws_error_event(
    details: OmniErrorDetails, *, event_id: str | None = None
) -> dict[str, Any]:
    """A WebSocket error event; ``event_id`` echoes the client event it answers."""
    record_error("websocket", details)
    event: dict[str, Any] = {"type": "error", "error": _with_retry(details)}
    if event_id is not None:
        event["event_id"] = event_id
    return event


def ws_close_code(details: OmniErrorDetails) -> int:
    """Close code after a terminal error event."""
    if details.status_code == 503:
        return _WS_CLOSE_TRY_AGAIN
    return _WS_CLOSE_CLIENT if details.category == "client" else _WS_CLOSE_SERVER


def job_error(details: OmniErrorDetails) -> dict[str, Any]:
    """The error object an async job stores and later returns unchanged;
    ``retryable`` says whether submitting the job again can succeed."""
    record_error("job", details)
    return _with_retry(details)


def websocket_denial(
    details: OmniErrorDetails, *, with_body: bool
) -> list[dict[str, Any]]:
    """ASGI messages refusing a WebSocket handshake.

    With the ``websocket.http.response`` extension the client gets the
    canonical status and body, as for HTTP; without it, the best a server can
    do before accept is a close frame with the transport's close code.
    """
    record_error("websocket", details)
    if not with_body:
        return [{"type": "websocket.close", "code": ws_close_code(details)}]
    headers = [(b"content-type", b"application/json")]
    headers += [
        (name.lower().encode(), value.encode())
        for name, value in retry_headers(details)
    ]
    if details.request_id:
        headers.append((b"x-request-id", details.request_id.encode()))
    return [
        {
            "type": "websocket.http.response.start",
            "status": details.status_code,
            "headers": headers,
        },
        {
            "type": "websocket.http.response.body",
            "body": _json(error_body(details)),
            "more_body": False,
        },
    ]
