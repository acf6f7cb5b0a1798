"""API-key authentication for every route (HTTP and WebSocket).

A FastAPI dependency, so a rejection is an ordinary semantic exception raised
inside the routes and rendered by the error boundary: 401
``AuthenticationError`` in the canonical envelope, and for a WebSocket a
denied handshake. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

from vllm_omni.errors import OmniClientError

__all__ = ["require_api_key"]


def _presented_key(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    # Browsers cannot set headers on a WebSocket handshake; accept the key as
    # a subprotocol-free header alternative used by OpenAI-style clients.
    return conn.headers.get("x-api-key")


async def require_api_key(conn: HTTPConnection) -> None:
    """Reject the request with 401 unless it presents the configured key."""
    expected: str | None = getattr(conn.app.state, "api_key", None)
    if not expected:
        return
    presented = _presented_key(conn)
    if presented is None or not hmac.compare_digest(
        presented.encode(), expected.encode()
    ):
        raise OmniClientError(
            "Invalid or missing API key.",
            status_code=401,
            error_type="AuthenticationError",
        )
