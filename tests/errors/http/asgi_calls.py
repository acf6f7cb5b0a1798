"""Driving an ASGI app by hand: a scope, scripted client messages, and what
the app sent back. Not a test module."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Scope


def http_scope(
    path: str = "/",
    *,
    method: str = "GET",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": list(headers),
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


class Client:
    """The client side of one ASGI call: hands out ``messages`` in order (a
    float is a pause before the next one), then waits forever; records what
    the app sends and how often the app asked for a message."""

    def __init__(self, messages: Sequence[Message | float] = ()) -> None:
        self._messages = list(messages)
        self.received: int = 0
        # Reads parked on a client that says nothing more (0 once all ended).
        self.waiting: int = 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        self.received += 1
        while self._messages:
            item = self._messages.pop(0)
            if isinstance(item, float):
                await asyncio.sleep(item)
                continue
            return item
        self.waiting += 1
        try:
            await asyncio.Event().wait()  # the client says nothing more
        finally:
            self.waiting -= 1
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    def header_values(self, name: bytes) -> list[bytes]:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return [v for k, v in message.get("headers", []) if k == name]
        return []


async def call(app: ASGIApp, scope: Scope, client: Client) -> Client:
    """Run one request to its end (a hung one fails the test after 10 s)."""
    await asyncio.wait_for(app(scope, client.receive, client.send), timeout=10)
    return client
