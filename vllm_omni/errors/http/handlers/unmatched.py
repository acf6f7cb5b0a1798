"""The router's answer when no route matches, on both transports.

Owns the unmatched WebSocket handshake: Starlette closes it bare (a 403 with
no body, no request id, not counted); here it is the same canonical 404 as
for HTTP, which the boundary renders as a denied handshake.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from vllm_omni.errors.http.handlers.http_exceptions import as_semantic

__all__ = ["not_found"]


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """Raise the 404 for an unmatched request: the framework's for HTTP (its
    handler renders it), the semantic one for a WebSocket (the boundary)."""
    not_found = StarletteHTTPException(404)
    if scope["type"] == "websocket":
        raise as_semantic(not_found)
    raise not_found
