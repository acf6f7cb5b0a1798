"""The renderers: one record → the canonical error object on every transport.

This is the only module that builds the OpenAI-style envelope
``{"error": {"message", "type", "param", "code", "request_id"?, "stage_id"?}}``
(DESIGN §4). Each transport has one function here, and each counts the error
it renders in ``vllm_omni:errors_total``. Renderers read only the record: they
never see the exception, so nothing the normalizer dropped can come back.
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
    "WS_CLOSE_TOO_BIG",
    "error_body",
    "error_object",
    "http_error_response",
    "job_error",
    "sse_error_events",
    "websocket_denial",
    "ws_close_code",
    "ws_error_event",
]

REQUEST_ID_HEADER = "X-Request-Id"
# A 503 (overload, shutting down, a stage pool drained) is retryable: tell
# clients and load balancers when (RFC 9110 §10.2.3), as upstream's
# QueueOverflowError asks them to retry.
RETRY_AFTER_HEADER = "Retry-After"
RETRY_AFTER_S = 1

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


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def http_error_response(
    details: OmniErrorDetails,
    *,
    transport: Transport = "http",
    allow: str | None = None,
) -> Response:
    """An HTTP response whose status always equals ``error.code``.

    ``allow`` is the ``Allow`` header a 405 must carry (RFC 9110 §15.5.6).
    """
    record_error(transport, details)
    headers: dict[str, str] = {}
    if details.request_id:
        headers[REQUEST_ID_HEADER] = details.request_id
    if allow is not None:
        headers["Allow"] = allow
    if details.status_code == 503:
        headers[RETRY_AFTER_HEADER] = str(RETRY_AFTER_S)
    return Response(
        _json(error_body(details)),
        status_code=details.status_code,
        headers=headers,
        media_type="application/json",
    )


def sse_error_events(details: OmniErrorDetails) -> bytes:
    """The terminal frames of a stream that already sent 200: error, then DONE."""
    record_error("sse", details)
    return b"data: " + _json(error_body(details)) + b"\n\ndata: [DONE]\n\n"


def ws_error_event(
    details: OmniErrorDetails, *, event_id: str | None = None
) -> dict[str, Any]:
    """A WebSocket error event; ``event_id`` echoes the client event it answers."""
    record_error("websocket", details)
    event: dict[str, Any] = {"type": "error", "error": error_object(details)}
    if event_id is not None:
        event["event_id"] = event_id
    return event


def ws_close_code(details: OmniErrorDetails) -> int:
    """Close code after a terminal error event."""
    if details.status_code == 503:
        return _WS_CLOSE_TRY_AGAIN
    return _WS_CLOSE_CLIENT if details.category == "client" else _WS_CLOSE_SERVER


def job_error(details: OmniErrorDetails) -> dict[str, Any]:
    """The error object an async job stores and later returns unchanged."""
    record_error("job", details)
    return error_object(details)


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
    if details.request_id:
        headers.append((b"x-request-id", details.request_id.encode()))
    if details.status_code == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
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
