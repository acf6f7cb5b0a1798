"""The HTTP metrics ``vllm serve`` exposes, with their route lookup remembered.

``prometheus_fastapi_instrumentator`` (the middleware ``vllm serve``
installs: ``http_requests_total``, the latency histograms, the sizes) finds
a request's ``handler`` label by matching the request against every route
of the app, at each request: about 25 µs on this project's two dozen routes
(docs/performance.md, what a refusal costs). The routes do not change once
the app serves, so the result is the same for every request with the same
root path, path and method; this keeps it, for a bounded number of paths
(paths no route templates, say a scan of unknown URLs, are looked up each
time once the bound is reached). The metrics, their labels and values are
the library's.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator.middleware import (
    PrometheusInstrumentatorMiddleware,
)
from starlette.middleware import Middleware
from starlette.requests import Request

__all__ = ["instrument"]

# Distinct (root path, path, method) whose handler is kept.
MAX_PATHS = 4096


class _RememberedRoutes(PrometheusInstrumentatorMiddleware):
    """The library's middleware, its handler lookup kept per path."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._handlers: dict[tuple[str, str, str], tuple[str, bool]] = {}

    def _get_handler(self, request: Request) -> tuple[str, bool]:
        scope = request.scope
        key = (scope.get("root_path", ""), scope["path"], scope.get("method", ""))
        handler = self._handlers.get(key)
        if handler is None:
            handler = super()._get_handler(request)
            if len(self._handlers) < MAX_PATHS:
                self._handlers[key] = handler
        return handler


def instrument(app: FastAPI, *, excluded: Sequence[str]) -> Instrumentator:
    """``Instrumentator(excluded_handlers=excluded).instrument(app)``, as
    ``vllm serve`` does, with the route lookup remembered."""
    instrumentator = Instrumentator(excluded_handlers=list(excluded)).instrument(app)
    app.user_middleware = [
        Middleware(_RememberedRoutes, *entry.args, **entry.kwargs)
        if entry.cls is PrometheusInstrumentatorMiddleware
        else entry
        for entry in app.user_middleware
    ]
    return instrumentator
