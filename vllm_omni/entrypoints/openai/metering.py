"""The HTTP metrics ``vllm serve`` exposes, at a fraction of their cost.

``prometheus_fastapi_instrumentator`` (the middleware ``vllm serve``
installs: ``http_requests_total``, the request and response sizes, the two
latency histograms) does, at each request: match the request against every
route of the app to name its ``handler``, build a request, a response and an
info object, look up five labelled children and await an empty gather.
About 70 µs of CPU, a fifth of what an overloaded server spends to refuse a
request (docs/performance.md). The routes and the label values do not change
once the app serves, so this keeps, per root path, path and method (for a
bounded number of paths; paths no route templates, say a scan of unknown
URLs, are looked up each time once the bound is reached), the handler and
the metric children it updates, and updates them directly.

The metrics are the library's own: its middleware creates them (its default
instrumentation, with the settings ``vllm serve`` uses) and this updates the
same objects with the same values, labels and statuses. Where the library's
settings or its default instrumentation are not the ones this knows (another
version, other options), the library's own code runs. ``tests/entrypoints/
openai/test_metering.py`` drives both with the same requests and compares
every sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from http import HTTPStatus
from timeit import default_timer
from typing import Any, NamedTuple

from fastapi import FastAPI
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, Summary
from prometheus_fastapi_instrumentator import Instrumentator, metrics
from prometheus_fastapi_instrumentator.middleware import (
    PrometheusInstrumentatorMiddleware,
)
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

__all__ = ["instrument"]

# Distinct (root path, path, method) whose handler and children are kept.
MAX_PATHS = 4096

# The default instrumentation's metrics and the labels each takes, as the
# library names them inside ``metrics.default``.
_LABELS = {
    "total_label_names": ("method", "status", "handler"),
    "in_size_names": ("handler",),
    "out_size_names": ("handler",),
    "latency_lower_names": ("method", "handler"),
}


class _Families(NamedTuple):
    """The library's default metrics, read from its instrumentation."""

    total: Counter
    in_size: Summary
    out_size: Summary
    highr: Histogram
    lowr: Histogram

    @classmethod
    def of(cls, instrumentation: Callable[..., Any]) -> _Families | None:
        """The metrics ``instrumentation`` updates, if it is the library's
        default one with the labels and options this updates them with."""
        code = getattr(instrumentation, "__code__", None)
        cells = getattr(instrumentation, "__closure__", None)
        if (
            getattr(instrumentation, "__module__", None) != metrics.__name__
            or getattr(instrumentation, "__qualname__", None)
            != "default.<locals>.instrumentation"
            or code is None
            or cells is None
        ):
            return None
        found = {
            name: cell.cell_contents
            for name, cell in zip(code.co_freevars, cells, strict=True)
        }
        if (
            any(found.get(name) != labels for name, labels in _LABELS.items())
            or found.get("custom_labels") != {}
            or found.get("should_exclude_streaming_duration") is not False
            or found.get("should_only_respect_2xx_for_highr") is not False
        ):
            return None
        try:
            return cls(
                found["TOTAL"],
                found["IN_SIZE"],
                found["OUT_SIZE"],
                found["LATENCY_HIGHR"],
                found["LATENCY_LOWR"],
            )
        except KeyError:
            return None


class _Path:
    """What a (root path, path, method) is metered as: nothing when its
    handler is excluded (no series of its own either), else the children of
    the metrics it updates."""

    __slots__ = ("handler", "in_size", "lowr", "method", "out_size", "total")

    def __init__(self, families: _Families, method: str, handler: str) -> None:
        self.handler = handler
        self.method = method
        self.in_size = families.in_size.labels(handler)
        self.out_size = families.out_size.labels(handler)
        self.lowr = families.lowr.labels(method, handler)
        # http_requests_total's child per status class, as they come.
        self.total: dict[str, Any] = {}


def _content_length(headers: Sequence[tuple[bytes, bytes]]) -> int:
    """The first ``Content-Length`` header's value, or 0 (as the library
    reads it through Starlette's headers)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value.decode("latin-1"))
    return 0


class _Metering(PrometheusInstrumentatorMiddleware):
    """The library's middleware (its settings, metrics and handler names),
    with what it looks up per request kept per path."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._handlers: dict[tuple[str, str, str], tuple[str, bool]] = {}
        self._paths: dict[tuple[str, str, str], _Path | None] = {}
        self._families = self._known_families()

    def _known_families(self) -> _Families | None:
        """The default metrics, when the settings are ``vllm serve``'s (the
        ones ``__call__`` implements); else ``None``: the library's code."""
        if (
            len(self.instrumentations) != 1
            or self.async_instrumentations
            or self.body_handlers
            or self.inprogress is not None
            or self.should_round_latency_decimals
            or not self.should_group_status_codes
            or not self.should_group_untemplated
        ):
            return None
        return _Families.of(self.instrumentations[0])

    def _get_handler(self, request: Request) -> tuple[str, bool]:
        # The library's own ``__call__`` (settings ``_Families`` does not
        # know) looks the handler up here, remembered per path too.
        scope = request.scope
        key = (scope.get("root_path", ""), scope["path"], scope.get("method", ""))
        handler = self._handlers.get(key)
        if handler is None:
            handler = super()._get_handler(request)
            if len(self._handlers) < MAX_PATHS:
                self._handlers[key] = handler
        return handler

    def _path(self, scope: Scope, families: _Families) -> _Path | None:
        key = (scope.get("root_path", ""), scope["path"], scope["method"])
        try:
            return self._paths[key]
        except KeyError:
            pass
        # The library's lookup: this entry is what remembers its answer.
        handler, templated = super()._get_handler(Request(scope))
        path = (
            None
            if self._is_handler_excluded(handler, templated)
            else _Path(families, scope["method"], handler if templated else "none")
        )
        if len(self._paths) < MAX_PATHS:
            self._paths[key] = path
        return path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        families = self._families
        if families is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        start = default_timer()
        path = self._path(scope, families)
        if path is None:
            await self.app(scope, receive, send)
            return
        status_code: int = 500
        response_headers: Sequence[tuple[bytes, bytes]] = ()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                nonlocal status_code, response_headers
                status_code = message["status"]
                response_headers = message.get("headers", ())
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            duration = max(default_timer() - start, 0.0)
            status = (
                str(status_code.value)
                if isinstance(status_code, HTTPStatus)
                else str(status_code)
            )[0] + "xx"
            total = path.total.get(status)
            if total is None:
                total = path.total[status] = families.total.labels(
                    path.method, status, path.handler
                )
            total.inc()
            path.in_size.observe(_content_length(scope["headers"]))
            path.out_size.observe(_content_length(response_headers))
            families.highr.observe(duration)
            path.lowr.observe(duration)


def instrument(
    app: FastAPI, *, excluded: Sequence[str], registry: CollectorRegistry = REGISTRY
) -> Instrumentator:
    """``Instrumentator(excluded_handlers=excluded).instrument(app)``, as
    ``vllm serve`` does, with what it looks up per request kept per path."""
    instrumentator = Instrumentator(
        excluded_handlers=list(excluded), registry=registry
    ).instrument(app)
    app.user_middleware = [
        Middleware(_Metering, *entry.args, **entry.kwargs)
        if entry.cls is PrometheusInstrumentatorMiddleware
        else entry
        for entry in app.user_middleware
    ]
    return instrumentator
