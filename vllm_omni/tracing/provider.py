"""Whether this process traces, and where its spans go.

The SDK is imported only when tracing turns on (docs/observability/tracing.md).
It must not know about requests or records.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING

from vllm_omni.errors import VLLMValidationError
from vllm_omni.version import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

__all__ = [
    "ENDPOINT_ENV",
    "PROTOCOL_ENV",
    "configure",
    "enabled",
    "flush",
    "resolve_endpoint",
    "tracer",
]

logger = logging.getLogger("vllm_omni.tracing")

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
GENERIC_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
DISABLED_ENV = "OTEL_SDK_DISABLED"
# vLLM's default (``vllm.tracing.otel.get_span_exporter``).
DEFAULT_PROTOCOL = "grpc"
_PROTOCOLS = ("grpc", "http/protobuf")
# Spans still queued when a process exits get this long to leave.
FLUSH_TIMEOUT_S = 2.0

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def protocol() -> str:
    """The OTLP protocol, as vLLM reads it; anything else is refused."""
    chosen = os.environ.get(PROTOCOL_ENV, DEFAULT_PROTOCOL).strip()
    if chosen not in _PROTOCOLS:
        raise VLLMValidationError(
            f"{PROTOCOL_ENV} must be one of {', '.join(_PROTOCOLS)}",
            parameter=PROTOCOL_ENV,
        )
    return chosen


def resolve_endpoint(endpoint: str | None) -> str | None:
    """The traces endpoint for ``--otlp-traces-endpoint`` ``endpoint``: it,
    else the environment's (the generic endpoint with ``/v1/traces`` for
    OTLP/HTTP, as the exporter appends it); ``None``: tracing stays off."""
    if os.environ.get(DISABLED_ENV, "").strip().lower() == "true":
        return None
    if endpoint:
        return endpoint
    specific = os.environ.get(ENDPOINT_ENV, "").strip()
    if specific:
        return specific
    generic = os.environ.get(GENERIC_ENDPOINT_ENV, "").strip()
    if not generic:
        return None
    if protocol() == "http/protobuf":
        return generic.rstrip("/") + "/v1/traces"
    return generic


def configure(endpoint: str | None, *, process: str) -> bool:
    """Turn tracing on in this process when ``resolve_endpoint(endpoint)``
    names one; ``process`` names this process in the spans' resource
    (``server``, ``stage-2``). Once on, later calls change nothing. Whether
    tracing is on."""
    global _provider, _tracer
    if _tracer is not None:
        return True
    resolved = resolve_endpoint(endpoint)
    if resolved is None:
        return False
    chosen = protocol()
    # The SDK only now: off, nothing of OpenTelemetry is imported.
    from vllm_omni.tracing.export import build_provider

    _provider = build_provider(
        resolved,
        chosen,
        {"vllm_omni.process": process, "process.pid": str(os.getpid())},
    )
    _tracer = _provider.get_tracer("vllm_omni", __version__)
    atexit.register(flush)
    logger.info("tracing: OTLP %s export to %s", chosen, resolved)
    return True


def tracer() -> Tracer | None:
    """This process's tracer; ``None`` while tracing is off."""
    return _tracer


def enabled() -> bool:
    """Whether this process traces."""
    return _tracer is not None


def flush(timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Hand every ended span to the exporter, waiting at most ``timeout_s``
    (a process about to exit: ``os._exit`` skips ``atexit``). The batch's
    own flush waits for its exports whatever the timeout (a collector that
    is down: the exporter's retries, 10 s a batch): it runs in a daemon
    thread, which an exit does not wait for."""
    if _provider is None:
        return
    flushing = threading.Thread(
        target=_provider.force_flush, name="otel-flush", daemon=True
    )
    flushing.start()
    flushing.join(timeout_s)
