"""The spans themselves, with the OpenTelemetry API.

Imported only once tracing is on (docs/observability/tracing.md). It must not
look at exceptions: records arrive already built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import (
    TraceContextTextMapPropagator,
)

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import abort_context
from vllm_omni.errors.outcome import Outcome, observe
from vllm_omni.tracing import attributes as a

__all__ = [
    "TRACE_HEADERS",
    "RootSpan",
    "StageSpan",
    "carrier",
    "current",
    "end_server_span",
    "job_span",
    "parent",
    "record",
    "start_server_span",
]

# The W3C headers a carrier holds (vLLM's ``TRACE_HEADERS``).
TRACE_HEADERS = ("traceparent", "tracestate")
_PROPAGATOR = TraceContextTextMapPropagator()


def parent(headers: Mapping[str, str] | None) -> Context | None:
    """The context a carrier continues (``None``: a new trace)."""
    if not headers:
        return None
    context = _PROPAGATOR.extract(headers)
    return (
        context if trace.get_current_span(context).get_span_context().is_valid else None
    )


def carrier(context: Context | None = None) -> dict[str, str] | None:
    """The W3C headers of ``context`` (default: the current one); ``None``
    when no span is active in it."""
    headers: dict[str, str] = {}
    _PROPAGATOR.inject(headers, context)
    return headers or None


def record(span: Span, details: OmniErrorDetails) -> None:
    """Put the record on ``span``: its attributes, and status ``ERROR`` with
    the public (sanitized) message for a server-owned failure."""
    span.set_attributes(a.record_attributes(details))
    if a.is_error(details):
        span.set_status(Status(StatusCode.ERROR, details.message))


class _Span:
    """What a stage's span and a caller's root span share: the headers the
    engine continues, a success and a failure with its record."""

    _span: Span

    def headers(self, incoming: dict[str, str] | None) -> dict[str, str] | None:
        """What the stage's engine continues (``trace_headers``): this span."""
        return carrier(trace.set_span_in_context(self._span))

    def finish(self) -> None:
        self._span.end()

    def fail(self, details: OmniErrorDetails) -> None:
        record(self._span, details)
        self._span.end()


class StageSpan(_Span):
    """One stage's work on one request, in the process that runs the stage."""

    def __init__(
        self,
        tracer: Tracer,
        request_id: str,
        headers: Mapping[str, str] | None,
        *,
        stage_id: int,
        name: str,
        kind: str,
    ) -> None:
        self._span = tracer.start_span(
            f"stage {name}",
            context=parent(headers),
            kind=SpanKind.INTERNAL,
            attributes={
                a.STAGE_ID: stage_id,
                a.STAGE_NAME: name,
                a.STAGE_KIND: kind,
                a.REQUEST_ID: request_id,
            },
        )

    def abort(self) -> None:
        """The orchestrator aborted the request here (its deadline, its
        client gone, another stage failed): not this stage's failure."""
        self._span.set_attribute(a.ABORTED, True)
        self._span.end()


class RootSpan(_Span):
    """The span of one request of a Python caller (``AsyncOmni.generate``
    outside any traced request): what its stages continue. Never made
    current: an async generator's context is its consumer's."""

    def __init__(
        self, tracer: Tracer, request_id: str, headers: Mapping[str, str] | None
    ) -> None:
        self._span = tracer.start_span(
            "generate",
            context=parent(headers),
            kind=SpanKind.SERVER,
            attributes={a.REQUEST_ID: request_id},
        )

    def abort(self) -> None:
        self._span.set_attribute(a.ABORT_REASON, "cancelled")
        self._span.end()


def current() -> bool:
    """Whether a span is current (a traced request is calling)."""
    return trace.get_current_span().get_span_context().is_valid


def start_server_span(
    tracer: Tracer,
    name: str,
    headers: Mapping[str, str] | None,
    attributes: Mapping[str, Any],
) -> tuple[Span, object, Outcome]:
    """A server span continuing ``headers`` (the client's), made current for
    the request's task, and the request's ``Outcome`` to read its record
    from at the end."""
    span = tracer.start_span(
        name, context=parent(headers), kind=SpanKind.SERVER, attributes=attributes
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    return span, token, observe()


def end_server_span(
    span: Span,
    token: object,
    outcome: Outcome,
    status: int | None,
    attributes: dict[str, Any] | None = None,
) -> None:
    """End a server span with ``attributes`` and what the request ended
    with: the status sent (``None``: nothing, or a WebSocket session), the
    record of its last error, the abort reason when the client went away or
    it was cancelled. One ``set_attributes`` for a success: each call takes
    the span's lock."""
    attributes = attributes or {}
    if status is not None:
        attributes[a.HTTP_STATUS] = status
    aborts = abort_context()
    if aborts is not None and aborts.reason is not None:
        attributes[a.ABORT_REASON] = aborts.reason
    details = outcome.details
    if details is not None:
        attributes.update(a.record_attributes(details))
        if a.is_error(details):
            span.set_status(Status(StatusCode.ERROR, details.message))
    # Without a record nothing failed that the boundary saw (it records every
    # error it renders, and sits inside this span): the status code alone is
    # kept, never read as an owner (docs/design.md §2).
    span.set_attributes(attributes)
    span.end()
    otel_context.detach(token)  # type: ignore[arg-type]


@contextlib.contextmanager
def job_span(tracer: Tracer, job_id: str, kind: str) -> Iterator[None]:
    """The span of one async job's run (a child of the request that created
    it, which may have ended long before): its record when it failed,
    ``cancelled`` when it was cancelled."""
    span, token, outcome = start_server_span(
        tracer, f"{kind} job", carrier(), {a.REQUEST_ID: job_id}
    )
    try:
        yield
    except BaseException:
        if outcome.details is None:
            span.set_attribute(a.ABORT_REASON, "cancelled")
        raise
    finally:
        end_server_span(span, token, outcome, None)
