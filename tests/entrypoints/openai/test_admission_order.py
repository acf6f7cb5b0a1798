"""A burst's refusals go out before its admitted requests' work (issue 46).

Requests that arrive together run their early admission check in turn: the
ones let through hold their place and wait one turn of the event loop, so
that the requests behind them are refused (a few hundred microseconds each)
before any admitted request builds its prompt and submits it. Driven through
the whole app (the error boundary, the metrics, the images route) on a
stand-in engine whose admission counts held places as the engine does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI

from vllm_omni.config import StageConfig
from vllm_omni.engine.request_table import (
    AdmissionHolds,
    refuse_over_limit,
    release_held_place,
)
from vllm_omni.entrypoints.openai.admission import (
    AdmissionGate,
    admit_before_routing,
    admitted,
)
from vllm_omni.entrypoints.openai.api_server import build_app
from vllm_omni.entrypoints.openai.auth import require_api_key
from vllm_omni.errors.http import install_error_handling

LIMIT = 2
BURST = 8


class _Engine:
    """Admission as ``RequestTable`` keeps it: in flight plus held places."""

    model_name = "omni-reference"
    modalities = frozenset({"image"})
    errored = False
    is_running = True

    def __init__(self) -> None:
        self.holds = AdmissionHolds()
        self.in_flight = 0
        self.events: list[tuple[str, str]] = []

    async def check_health(self) -> None:
        return None

    def stage_for(self, modality: str) -> StageConfig | None:
        return StageConfig(4, "image", "image") if modality == "image" else None

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        try:
            refuse_over_limit(request_id, self.in_flight + self.holds.count, LIMIT)
        except Exception:
            self.events.append(("refused", request_id))
            raise
        return self.holds.hold()

    async def generate(
        self, prompt: str, *, request_id: str, **kwargs: Any
    ) -> AsyncIterator[SimpleNamespace]:
        release_held_place()
        refuse_over_limit(request_id, self.in_flight + self.holds.count, LIMIT)
        self.in_flight += 1
        self.events.append(("submitted", request_id))
        try:
            await asyncio.sleep(0.01)
            yield SimpleNamespace(images=[b"\x89PNG\r\n\x1a\n"], finished=True)
        finally:
            self.in_flight -= 1


async def _post(app: Any, body: dict[str, Any], request_id: str) -> tuple[int, bytes]:
    """One request to the images route, driven as uvicorn drives the app: it
    reaches the app in the turn of the event loop it arrives in."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/images/generations",
        "raw_path": b"/v1/images/generations",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"omni"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
            (b"x-request-id", request_id.encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


@pytest.mark.parametrize("turns_apart", [0, 1])
async def test_refusals_are_answered_before_admitted_work(turns_apart: int) -> None:
    """``turns_apart``: turns of the event loop between two requests'
    arrivals (uvicorn reads a burst over several, and a request read in one
    turn reaches the app in the next)."""
    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    engine = _Engine()
    app.state.engine_client = engine
    sent = []
    for i in range(BURST):
        body = {"prompt": f"burst {i}", "size": "64x64"}
        sent.append(asyncio.ensure_future(_post(app, body, f"burst-{i}")))
        for _ in range(turns_apart):
            await asyncio.sleep(0)
    answers = await asyncio.gather(*sent)
    statuses = [status for status, _ in answers]
    assert statuses == [200] * LIMIT + [503] * (BURST - LIMIT), statuses
    for _, refused in answers[LIMIT:]:
        assert json.loads(refused)["error"]["code"] == 503
    kinds = [kind for kind, _ in engine.events]
    # Every refusal before the first admitted request's submission.
    assert kinds == ["refused"] * (BURST - LIMIT) + ["submitted"] * LIMIT, engine.events
    assert (engine.in_flight, engine.holds.count) == (0, 0)


class _Full:
    """An engine at its limit: every admission is refused."""

    errored = False

    def __init__(self) -> None:
        self.asked: list[str] = []

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        self.asked.append(request_id)
        refuse_over_limit(request_id, LIMIT, LIMIT)
        raise AssertionError("refuse_over_limit returned at the limit")


class _Routes:
    """Pure ASGI outside the boundary: the route each request was named."""

    def __init__(self, app: Any, seen: list[object]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        self.seen.append(getattr(scope.get("route"), "path", None))


def _gated_app(seen: list[object]) -> FastAPI:
    app = FastAPI()

    @app.post("/shadowed")
    async def first() -> dict[str, str]:
        return {"served": "first"}

    @admitted
    @app.post("/shadowed")
    async def second() -> dict[str, str]:  # never served: the first wins
        return {"served": "second"}

    @admitted
    @app.post("/generate", dependencies=[Depends(require_api_key)])
    async def generate() -> dict[str, str]:
        return {"served": "generate"}

    install_error_handling(app)
    app.add_middleware(_Routes, seen=seen)
    admit_before_routing(app)
    app.state.api_keys = (b"key",)
    app.state.engine_client = _Full()
    return app


async def test_the_gate_refuses_before_routing_what_the_router_would_admit() -> None:
    """The gate's table is the router's answer: an admitted route is gated
    for the paths and methods it serves, and only those; a refusal keeps
    the route's name (a span's), and the key is checked before admission."""
    seen: list[object] = []
    app = _gated_app(seen)
    assert app.user_middleware[-1].cls is AdmissionGate
    engine = app.state.engine_client
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://omni") as http:
        keyed = {"Authorization": "Bearer key", "X-Request-Id": "full-1"}
        refused = await http.post("/generate", headers=keyed)
        unkeyed = await http.post("/generate", headers={"X-Request-Id": "nokey"})
        shadowed = await http.post("/shadowed", headers={"X-Request-Id": "first"})
        wrong_method = await http.get("/generate", headers=keyed)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["request_id"] == "full-1"
    assert unkeyed.status_code == 401, unkeyed.text
    assert shadowed.json() == {"served": "first"}
    assert wrong_method.status_code == 405
    # Admission was asked once, for the keyed request to the admitted route.
    assert engine.asked == ["full-1"]
    assert seen == ["/generate", "/generate", "/shadowed", "/generate"]


def test_an_admitted_route_needs_a_fixed_path() -> None:
    app = FastAPI()

    @admitted
    @app.post("/v1/things/{thing}")
    async def thing(thing: str) -> str:
        return thing

    with pytest.raises(RuntimeError, match="path parameters"):
        admit_before_routing(app)
