"""A real OTLP/HTTP trace receiver on loopback, for tests and benchmarks.

It accepts ``POST /v1/traces`` (``application/x-protobuf``, gzip or not),
decodes each ``ExportTraceServiceRequest`` with ``opentelemetry-proto``
(what a collector does) and keeps the spans as plain ``Span`` records: ids
in hex, attributes as Python values, the resource's attributes beside them.
``refusing`` makes it answer 503 instead (a collector that refuses).
"""

from __future__ import annotations

import dataclasses
import gzip
import http.server
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.e2e.omni_server import OmniServer, start_server

__all__ = [
    "TRACE_ENV",
    "Receiver",
    "Span",
    "TraceParent",
    "post_chat",
    "receiver",
    "start_traced_server",
    "tree",
]

# What the tests' servers export with: OTLP/HTTP (the receiver's protocol),
# each process's spans leaving within a twentieth of a second.
TRACE_ENV = {
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "50",
}

# The span kinds and status codes by their proto names, without the prefix.
KINDS = {
    value: name.removeprefix("SPAN_KIND_") for name, value in ProtoSpan.SpanKind.items()
}
STATUS = {
    value: name.removeprefix("STATUS_CODE_")
    for name, value in Status.StatusCode.items()
}


@dataclasses.dataclass(frozen=True)
class Span:
    """One received span."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str
    status: str
    status_message: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    if field == "array_value":
        return [_value(item) for item in value.array_value.values]
    if field == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, field) if field else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=KINDS[span.kind],
                        status=STATUS[span.status.code],
                        status_message=span.status.message,
                        attributes=_attributes(span.attributes),
                        resource=resource,
                    )
                )
    return spans


class Receiver:
    """The spans received so far, and the server that receives them."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self.refusing = False
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or owner.refusing:
                    self.send_response(404 if self.path != "/v1/traces" else 503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                owner._keep(decode(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )

    @property
    def endpoint(self) -> str:
        """What ``--otlp-traces-endpoint`` names (OTLP/HTTP's traces path)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1/traces"

    def _keep(self, spans: list[Span]) -> None:
        with self._lock:
            self.posts += 1
            self.spans.extend(spans)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, done: Callable[[list[Span]], bool], within_s: float = 30
    ) -> list[Span]:
        """The spans of ``trace_id`` once ``done`` says they are all there."""
        deadline = time.monotonic() + within_s
        while True:
            spans = self.trace(trace_id)
            if done(spans):
                return spans
            assert time.monotonic() < deadline, [s.name for s in spans]
            time.sleep(0.05)


@dataclasses.dataclass(frozen=True)
class TraceParent:
    """A client's span: what it sends as ``traceparent``."""

    trace_id: str = dataclasses.field(default_factory=lambda: os.urandom(16).hex())
    span_id: str = dataclasses.field(default_factory=lambda: os.urandom(8).hex())

    @property
    def headers(self) -> dict[str, str]:
        return {"traceparent": f"00-{self.trace_id}-{self.span_id}-01"}


Tree = list[tuple[str, "Tree"]]


def tree(spans: list[Span], parent_id: str) -> Tree:
    """The spans under ``parent_id`` by name, children sorted by name."""
    return sorted(
        (span.name, tree(spans, span.span_id))
        for span in spans
        if span.parent_span_id == parent_id
    )


def receiver() -> Iterator[Receiver]:
    """A started receiver, stopped after use (a fixture's body)."""
    started = Receiver()
    started.start()
    try:
        yield started
    finally:
        started.stop()


def start_traced_server(
    directory: Path,
    pipeline: Path | str,
    collector: Receiver,
    *,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> OmniServer:
    """``start_server`` exporting its traces to ``collector`` (not waited
    for: the caller waits as its backend needs)."""
    return start_server(
        directory,
        pipeline,
        env={**TRACE_ENV, **(env or {})},
        extra_args=("--otlp-traces-endpoint", collector.endpoint, *extra_args),
    )


def post_chat(
    server: OmniServer,
    content: str,
    parent: TraceParent,
    *,
    timeout: float = 30,
    **fields: Any,
) -> httpx.Response:
    """A chat request of one user message in ``parent``'s trace."""
    return httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": content}], **fields},
        headers=parent.headers,
        timeout=timeout,
    )
