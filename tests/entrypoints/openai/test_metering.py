"""The HTTP metrics (``entrypoints/openai/metering.py``): the library's
handler labels from a lookup remembered per path, and every sample the
library's own middleware would record for the same requests."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator.middleware import (
    PrometheusInstrumentatorMiddleware,
)
from starlette.requests import Request

from vllm_omni.entrypoints.openai import metering
from vllm_omni.entrypoints.openai.api_server import build_app

APP = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
REQUESTS = [
    ("POST", "/v1/chat/completions", ("/v1/chat/completions", True)),
    ("GET", "/v1/chat/completions", ("/v1/chat/completions", True)),
    ("PUT", "/v1/videos/video_1", ("/v1/videos/{video_id}", True)),
    ("GET", "/v1/videos/video_2/content", ("/v1/videos/{video_id}/content", True)),
    ("GET", "/no/such/route", ("/no/such/route", False)),
    ("GET", "/metrics", ("/metrics", True)),
]


def _request(method: str, path: str) -> Request:
    return Request(
        {
            "type": "http",
            "app": APP,
            "method": method,
            "path": path,
            "root_path": "",
            "query_string": b"",
            "headers": [],
        }
    )


def _middleware() -> metering._Metering:
    middleware = object.__new__(metering._Metering)
    middleware._handlers = {}
    middleware.should_include_root_path = False
    return middleware


def test_the_server_meters_with_the_remembered_lookup() -> None:
    classes = [entry.cls for entry in APP.user_middleware]
    assert metering._Metering in classes
    assert PrometheusInstrumentatorMiddleware not in classes


@pytest.mark.parametrize(("method", "path", "expected"), REQUESTS)
def test_each_handler_is_the_librarys(
    method: str, path: str, expected: tuple[str, bool]
) -> None:
    middleware = _middleware()
    library = PrometheusInstrumentatorMiddleware._get_handler(
        middleware, _request(method, path)
    )
    assert library == expected
    # Looked up once, then remembered: the same answer.
    assert middleware._get_handler(_request(method, path)) == expected
    assert middleware._get_handler(_request(method, path)) == expected
    assert len(middleware._handlers) == 1


def test_the_remembered_paths_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metering, "MAX_PATHS", 2)
    middleware = _middleware()
    for index in range(5):
        path = f"/scan/{index}"
        assert middleware._get_handler(_request("GET", path)) == (path, False)
    assert len(middleware._handlers) == 2


def _metered_app(ours: bool) -> tuple[FastAPI, CollectorRegistry]:
    """An app with templated, streamed, empty, failing and excluded routes,
    metered by our middleware or by the library's, in a registry of its own."""
    app = FastAPI()

    @app.get("/items/{item}")
    async def item(item: str) -> dict[str, str]:
        return {"item": item}

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"one"
            yield b"two"

        return StreamingResponse(chunks())

    @app.delete("/items/{item}", status_code=204)
    async def delete(item: str) -> None:
        return None

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("boom")

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    registry = CollectorRegistry()
    if ours:
        metering.instrument(app, excluded=["/health"], registry=registry)
        assert [m.cls for m in app.user_middleware] == [metering._Metering]
    else:
        Instrumentator(excluded_handlers=["/health"], registry=registry).instrument(app)
    return app, registry


# Method, path, body; twice each, so that remembered paths are used.
DRIVEN = [
    ("GET", "/items/a", None),
    ("GET", "/items/b?x=1", None),
    ("POST", "/upload", b"x" * 300),
    ("POST", "/upload", b""),
    ("GET", "/stream", None),
    ("DELETE", "/items/c", None),
    ("GET", "/boom", None),
    ("GET", "/health", None),
    ("GET", "/no/such/route", None),
    ("PUT", "/upload", b"{}"),
    ("HEAD", "/items/a", None),
] * 2


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[Any, ...]], float]:
    """Every sample but the latencies' own values (their counts stay)."""
    found: dict[tuple[str, tuple[Any, ...]], float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            timed = family.name.startswith("http_request_duration")
            if timed and not sample.name.endswith("_count"):
                continue
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def _drive(app: FastAPI) -> list[int]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return [
            (await client.request(method, path, content=body)).status_code
            for method, path, body in DRIVEN
        ]


async def test_every_sample_is_the_librarys() -> None:
    (ours, our_registry), (library, library_registry) = (
        _metered_app(True),
        _metered_app(False),
    )
    assert await _drive(ours) == await _drive(library)
    expected = _samples(library_registry)
    assert _samples(our_registry) == expected
    # The figures mean something: every status class, sizes, untemplated.
    total = {
        labels: value
        for (name, labels), value in expected.items()
        if name == "http_requests_total"
    }
    assert total[(("handler", "/upload"), ("method", "POST"), ("status", "2xx"))] == 4
    assert total[(("handler", "/boom"), ("method", "GET"), ("status", "5xx"))] == 2
    assert total[(("handler", "none"), ("method", "GET"), ("status", "4xx"))] == 2
    assert (
        total[(("handler", "/items/{item}"), ("method", "DELETE"), ("status", "2xx"))]
        == 2
    )
    assert not any(dict(labels).get("handler") == "/health" for labels in total)
    assert expected[("http_request_size_bytes_sum", (("handler", "/upload"),))] == 604
    assert expected[("http_response_size_bytes_sum", (("handler", "/stream"),))] == 0


def test_settings_it_does_not_know_run_the_librarys_code() -> None:
    registry = CollectorRegistry()
    app = FastAPI()
    Instrumentator(registry=registry, should_round_latency_decimals=True).instrument(
        app
    )
    entry = app.user_middleware[0]
    middleware = metering._Metering(app.router, *entry.args, **entry.kwargs)
    assert middleware._families is None
    registry = CollectorRegistry()
    known = metering._Metering(FastAPI().router, registry=registry)
    assert known._families is not None
    assert known._families.total._name == "http_requests"  # the _total is added
