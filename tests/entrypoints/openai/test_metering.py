"""The HTTP metrics' route lookup, remembered per path, gives the library's
handler labels (``entrypoints/openai/metering.py``)."""

from __future__ import annotations

import argparse

import pytest
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


def _middleware() -> metering._RememberedRoutes:
    middleware = object.__new__(metering._RememberedRoutes)
    middleware._handlers = {}
    middleware.should_include_root_path = False
    return middleware


def test_the_server_meters_with_the_remembered_lookup() -> None:
    classes = [entry.cls for entry in APP.user_middleware]
    assert metering._RememberedRoutes in classes
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
