"""What the engine, the stages and the job workers call for each request.

Each hook is one global read when tracing is off, and hands over to
``spans`` when it is on (docs/observability/tracing.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Protocol

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.tracing.provider import tracer

__all__ = [
    "OFF",
    "StageSpan",
    "job_span",
    "request_span",
    "stage_span",
    "submission_headers",
]

_TRACE_HEADERS = ("traceparent", "tracestate")


class StageSpan(Protocol):
    """A span of one request (a stage's work, or a Python caller's whole
    request); each request ends it exactly once."""

    def headers(self, incoming: dict[str, str] | None) -> dict[str, str] | None:
        """The ``trace_headers`` the stage's engine continues."""
        ...

    def finish(self) -> None: ...

    def fail(self, details: OmniErrorDetails) -> None: ...

    def abort(self) -> None: ...


class _Off:
    """The stage span of a process that does not trace: nothing."""

    def headers(self, incoming: dict[str, str] | None) -> dict[str, str] | None:
        return incoming

    def finish(self) -> None:
        pass

    def fail(self, details: OmniErrorDetails) -> None:
        pass

    def abort(self) -> None:
        pass


OFF = _Off()


def _w3c(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """Only the W3C trace headers of ``headers`` (vLLM's
    ``extract_trace_headers``), as plain strings."""
    if not headers:
        return None
    kept = {
        name: value
        for name in _TRACE_HEADERS
        if isinstance(value := headers.get(name), str)
    }
    return kept or None


def submission_headers(
    trace_headers: Mapping[str, str] | None,
) -> dict[str, str] | None:
    """The W3C headers a request's submissions carry: the current span's when
    this process traces, else the caller's ``trace_headers`` as given, so a
    ``vllm`` stage's engine still joins the caller's trace."""
    if tracer() is None:
        return _w3c(trace_headers)
    from vllm_omni.tracing.spans import carrier

    return carrier() or _w3c(trace_headers)


def stage_span(
    request_id: str,
    headers: Mapping[str, str] | None,
    *,
    stage_id: int,
    name: str,
    kind: str,
) -> StageSpan:
    """The span of stage ``stage_id``'s work on ``request_id`` (``OFF`` when
    this process does not trace)."""
    active = tracer()
    if active is None:
        return OFF
    from vllm_omni.tracing.spans import StageSpan as OnSpan

    return OnSpan(active, request_id, headers, stage_id=stage_id, name=name, kind=kind)


def request_span(request_id: str, trace_headers: Mapping[str, str] | None) -> StageSpan:
    """The root span of a Python caller's request, its stages' parent, when no
    traced request is calling (``OFF`` otherwise)."""
    active = tracer()
    if active is None:
        return OFF
    from vllm_omni.tracing.spans import RootSpan, current

    if current():
        return OFF
    return RootSpan(active, request_id, _w3c(trace_headers))


@contextlib.contextmanager
def job_span(job_id: str, kind: str) -> Iterator[None]:
    """Around one async job's run: its span, when this process traces."""
    active = tracer()
    if active is None:
        yield
        return
    from vllm_omni.tracing.spans import job_span as traced

    with traced(active, job_id, kind):
        yield
