"""The layers ``install_error_handling`` builds (``register``): the boundary
is the innermost user middleware whatever is added before or after it, so
every middleware outside it sees the status the client really got; the
framework handlers run inside it; the outer safety net still answers a
failure in a middleware outside it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_omni.errors import VLLMValidationError
from vllm_omni.errors.http import ErrorBoundary, install_error_handling


class StatusRecorder:
    """A user middleware that notes the status of every response it sees, as
    the Prometheus instrumentator does."""

    def __init__(self, app: ASGIApp, seen: list[int]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append(message["status"])
            await send(message)

        await self.app(scope, receive, noting)


class Exploding:
    """A user middleware that fails on every request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raise RuntimeError("middleware bug")
        await self.app(scope, receive, send)


def _app(before: list[int], after: list[int]) -> FastAPI:
    app = FastAPI()

    @app.get("/invalid")
    async def invalid() -> dict[str, str]:
        raise VLLMValidationError("temperature must be <= 2", parameter="temperature")

    @app.get("/crash")
    async def crash() -> dict[str, str]:
        raise KeyError("internal")

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(StatusRecorder, seen=before)
    install_error_handling(app)
    app.add_middleware(StatusRecorder, seen=after)
    app.add_middleware(GZipMiddleware)
    return app


def _layers(app: FastAPI) -> list[type[Any]]:
    layer: Any = app.build_middleware_stack()
    found: list[type[Any]] = []
    while layer is not None and not isinstance(layer, type(app.router)):
        found.append(type(layer))
        layer = getattr(layer, "app", None)
    return found


def test_the_boundary_is_the_innermost_user_middleware() -> None:
    app = _app([], [])
    assert app.user_middleware[-1].cls is ErrorBoundary
    layers = _layers(app)
    boundary = layers.index(ErrorBoundary)
    # Right outside the framework handlers, inside every other middleware.
    assert layers[boundary + 1] is ExceptionMiddleware
    assert layers.count(StatusRecorder) == 2
    assert max(i for i, t in enumerate(layers) if t is StatusRecorder) < boundary
    assert layers.index(GZipMiddleware) < boundary


@pytest.mark.parametrize(
    ("path", "status"),
    [("/ok", 200), ("/invalid", 400), ("/crash", 500), ("/nowhere", 404)],
)
async def test_middleware_before_and_after_install_see_the_client_status(
    path: str, status: int
) -> None:
    before: list[int] = []
    after: list[int] = []
    transport = httpx.ASGITransport(app=_app(before, after))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get(path)
    assert response.status_code == status
    assert before == after == [status]


async def test_a_wrong_method_is_a_405_inside_the_recorders() -> None:
    before: list[int] = []
    after: list[int] = []
    transport = httpx.ASGITransport(app=_app(before, after))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/ok")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    assert before == after == [405]


async def test_the_safety_net_answers_a_failing_outer_middleware() -> None:
    app = _app([], [])
    app.add_middleware(Exploding)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/ok", headers={"X-Request-Id": "outer-1"})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == 500
    assert response.json()["error"]["request_id"] == "outer-1"
    assert response.headers.get_list("x-request-id") == ["outer-1"]


def test_installing_twice_keeps_one_boundary_with_the_last_settings() -> None:
    app = FastAPI()
    install_error_handling(app, max_request_bytes=10)
    app.add_middleware(GZipMiddleware)
    install_error_handling(app, mode="legacy", max_request_bytes=20)
    boundaries = [m for m in app.user_middleware if m.cls is ErrorBoundary]
    assert len(boundaries) == 1
    assert app.user_middleware[-1] is boundaries[0]
    assert boundaries[0].kwargs == {
        "mode": "legacy",
        "max_request_bytes": 20,
        "max_ws_message_bytes": None,
    }
    assert app.state.error_mode == "legacy"


def test_an_unknown_mode_is_refused_before_anything_is_installed() -> None:
    app = FastAPI()
    with pytest.raises(RuntimeError, match="error mode must be one of"):
        install_error_handling(app, mode="lenient")  # type: ignore[arg-type]
    assert app.user_middleware == []
    assert Exception not in app.exception_handlers
    assert not hasattr(app.state, "error_mode")
