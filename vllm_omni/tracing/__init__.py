"""OpenTelemetry traces of requests: one trace per request across every stage.

Off, nothing of OpenTelemetry is imported. The modules and what each owns:
docs/observability/tracing.md, "Where it lives".
"""
