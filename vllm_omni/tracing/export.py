"""OTLP export with the OpenTelemetry SDK: the provider, the exporter, the batch.

The only module that imports the SDK; a collector that is down costs
requests nothing (docs/observability/tracing.md).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

__all__ = ["PROTOCOLS", "build_provider"]

logger = logging.getLogger("vllm_omni.tracing")

# The values of OTEL_EXPORTER_OTLP_TRACES_PROTOCOL that vLLM accepts.
PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_SERVICE_NAME = "vllm-omni"
# The exporters log every failed batch (and every retry); ``_Reported`` logs
# an outage once instead.
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.sdk.trace.export",
)
# The batch logs every span it drops while its queue is full (a collector
# slower than the requests): on the request's path, once is enough.
_BATCH_LOGGER = "opentelemetry.sdk._shared_internal"


class _Once(logging.Filter):
    """Lets the first "queue full" record through, and no later one."""

    def __init__(self) -> None:
        super().__init__()
        self._seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Queue full"):
            return True
        seen, self._seen = self._seen, True
        return not seen


class _Reported(SpanExporter):
    """An exporter whose outages are logged once each: the first failed
    batch at WARNING, the recovery at INFO."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = endpoint
        self._failing = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:  # an exporter bug must not end the export thread
            result = SpanExportResult.FAILURE
        with self._lock:
            failing = result is not SpanExportResult.SUCCESS
            changed, self._failing = failing != self._failing, failing
        if changed and failing:
            logger.warning(
                "trace export to %s failed; spans are dropped until it answers "
                "(logged once)",
                self._endpoint,
            )
        elif changed:
            logger.info("trace export to %s answers again", self._endpoint)
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


def _exporter(endpoint: str | None, protocol: str) -> SpanExporter:
    """vLLM's choice (``vllm.tracing.otel.get_span_exporter``); ``endpoint``
    None: the exporter reads the ``OTEL_EXPORTER_OTLP_*`` environment."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint)


def build_provider(
    endpoint: str | None, protocol: str, attributes: Mapping[str, str]
) -> TracerProvider:
    """A provider exporting to ``endpoint`` over ``protocol`` in batches;
    ``attributes`` describe this process (the resource). ``OTEL_SERVICE_NAME``
    and ``OTEL_RESOURCE_ATTRIBUTES`` are honoured; the service name defaults
    to ``vllm-omni``."""
    for name in _EXPORTER_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    batch_logger = logging.getLogger(_BATCH_LOGGER)
    if not any(isinstance(f, _Once) for f in batch_logger.filters):
        batch_logger.addFilter(_Once())
    resource = dict(attributes)
    if not os.environ.get("OTEL_SERVICE_NAME"):
        resource[SERVICE_NAME] = DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create(resource))
    shown = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or ""
    exporter = _Reported(_exporter(endpoint, protocol), shown or "the collector")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
