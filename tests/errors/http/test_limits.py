"""The body and WebSocket message limits (``limits``): a 413 while the body
is read, a declared ``Content-Length`` refused before a byte is read, the
rest of a body never read, and a WebSocket message over the limit answered
with one error event and close 1009 instead of reaching the route."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message

from tests.errors.http.asgi_calls import Client, http_scope
from vllm_omni.errors.http import install_error_handling
from vllm_omni.errors.http.limits import limit_body, limit_messages
from vllm_omni.errors.render import WS_CLOSE_TOO_BIG

LIMIT = 16


def _chunk(body: bytes, more: bool = True) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.post("/ignore-body")
    async def ignore_body() -> dict[str, str]:
        return {"status": "ok"}

    install_error_handling(app, max_request_bytes=LIMIT)
    return app


async def _post(path: str, content: bytes | list[bytes]) -> httpx.Response:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        if isinstance(content, list):  # chunked: no Content-Length

            async def chunks() -> AsyncIterator[bytes]:
                for part in content:
                    yield part

            return await client.post(path, content=chunks())
        return await client.post(path, content=content)


async def test_a_body_at_the_limit_passes() -> None:
    response = await _post("/echo", b"x" * LIMIT)
    assert response.status_code == 200
    assert response.json() == {"bytes": LIMIT}


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_past_the_limit_is_a_canonical_413(chunked: bool) -> None:
    body = b"x" * (LIMIT + 1)
    response = await _post("/echo", [body[:10], body[10:]] if chunked else body)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == 413
    assert error["message"] == f"The request body must be at most {LIMIT} bytes."
    assert error["request_id"] == response.headers["x-request-id"]


async def test_nothing_is_checked_before_the_route_reads() -> None:
    # A route that never asks for its body is not refused for it.
    response = await _post("/ignore-body", b"x" * (LIMIT * 4))
    assert response.status_code == 200


async def test_a_declared_length_is_refused_before_a_byte_is_read() -> None:
    scope = http_scope(method="POST", headers=[(b"content-length", b"17")])
    client = Client([_chunk(b"x" * 17, more=False)])
    receive = limit_body(scope, client.receive, LIMIT)
    with pytest.raises(StarletteHTTPException) as raised:
        await receive()
    assert raised.value.status_code == 413
    assert client.received == 0


async def test_a_chunked_body_stops_at_the_chunk_that_passes() -> None:
    scope = http_scope(method="POST")
    client = Client([_chunk(b"x" * 10), _chunk(b"x" * 10), _chunk(b"x" * 10, False)])
    receive = limit_body(scope, client.receive, LIMIT)
    assert (await receive())["body"] == b"x" * 10
    with pytest.raises(StarletteHTTPException):
        await receive()
    assert client.received == 2  # the third chunk is never read


async def test_a_bad_declared_length_is_left_to_the_count() -> None:
    scope = http_scope(method="POST", headers=[(b"content-length", b"lots")])
    client = Client([_chunk(b"x" * 4, more=False)])
    receive = limit_body(scope, client.receive, LIMIT)
    assert (await receive())["body"] == b"x" * 4


def _ws_scope() -> dict[str, object]:
    return {**http_scope("/ws"), "type": "websocket"}


@pytest.mark.parametrize(
    "message",
    [
        {"type": "websocket.receive", "bytes": b"x" * (LIMIT + 1)},
        {"type": "websocket.receive", "text": "x" * (LIMIT + 1)},
        # 6 characters, 18 bytes as UTF-8: over a limit of 16 bytes as sent.
        {"type": "websocket.receive", "text": "\u20ac" * 6},
    ],
)
async def test_a_websocket_message_over_the_limit_closes_with_1009(
    message: Message,
) -> None:
    client = Client([message, {"type": "websocket.receive", "text": "after"}])
    receive = limit_messages(_ws_scope(), client.receive, client.send, LIMIT, "strict")
    closed = await receive()
    assert closed == {"type": "websocket.disconnect", "code": WS_CLOSE_TOO_BIG}
    event, close = client.sent
    assert event["type"] == "websocket.send"
    error = json.loads(event["text"])["error"]
    assert error["code"] == 413
    assert error["message"] == f"A WebSocket message must be at most {LIMIT} bytes."
    assert close == {"type": "websocket.close", "code": WS_CLOSE_TOO_BIG}
    # The session is over for the route: the next read is the same close,
    # and the client's next message is never read.
    assert await receive() == closed
    assert client.received == 1


@pytest.mark.parametrize(
    "message",
    [
        {"type": "websocket.receive", "bytes": b"x" * LIMIT},
        {"type": "websocket.receive", "text": "\u20ac" * 5},  # 15 bytes
        {"type": "websocket.connect"},
    ],
)
async def test_a_websocket_message_within_the_limit_passes(message: Message) -> None:
    client = Client([message])
    receive = limit_messages(_ws_scope(), client.receive, client.send, LIMIT, "strict")
    assert await receive() == message
    assert client.sent == []
