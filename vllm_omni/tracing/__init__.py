"""OpenTelemetry traces of requests: one trace per request across every stage.

With ``--otlp-traces-endpoint`` (or the standard ``OTEL_*`` environment) each
process exports spans over OTLP with the official SDK: a server span per
HTTP request, WebSocket session or async job run, a child span per stage the
request passes through (in whichever process or Ray actor runs it), and the
error record on the span where the failure happened and on the server span
(docs/observability/tracing.md). Off, nothing of OpenTelemetry is imported.

Modules, lowest first: ``provider`` (on or off; the SDK only through
``export``), ``attributes`` (a record as span attributes, no OpenTelemetry),
``spans`` (the OpenTelemetry API: the spans themselves), ``hooks`` (what the
engine, the stages and the jobs call per request; one global read when off),
``asgi`` (the server span middleware, installed only when on). Nothing here
imports the engine, the stages, the entrypoints or the HTTP boundary.
"""
