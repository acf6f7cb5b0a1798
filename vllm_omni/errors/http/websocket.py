"""A WebSocket session's edges: a client that left, a refused handshake.

Owns marking a session's aborts as client disconnects (the client closed,
or a send found it gone) and denying a handshake with the canonical status
and body. Must not build an error body: ``vllm_omni.errors.render`` does.
"""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import AbortContext
from vllm_omni.errors.render import websocket_denial

__all__ = ["deny_websocket", "websocket_receive", "websocket_send"]


def websocket_receive(receive: Receive, context: AbortContext) -> Receive:
    """``receive`` that marks the session's aborts as client disconnects once
    the client closed its side."""

    async def marking() -> Message:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            context.reason = "client_disconnect"
        return message

    return marking


def websocket_send(send: Send, context: AbortContext) -> Send:
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
