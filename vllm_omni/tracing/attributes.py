"""Span attribute names, and an error record as span attributes.

Read from the record alone, so a span says what the response says; decides a
span's ``ERROR`` status too (docs/observability/tracing.md). No OpenTelemetry
import.
"""

from __future__ import annotations

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.render import should_retry

__all__ = [
    "ABORTED",
    "ABORT_REASON",
    "CATEGORY",
    "ERROR_MESSAGE",
    "ERROR_PARAM",
    "ERROR_TYPE",
    "FATAL",
    "HTTP_METHOD",
    "HTTP_ROUTE",
    "HTTP_STATUS",
    "REQUEST_ID",
    "RETRYABLE",
    "STAGE_ID",
    "STAGE_KIND",
    "STAGE_NAME",
    "STATUS_CODE",
    "URL_PATH",
    "URL_SCHEME",
    "is_error",
    "record_attributes",
]

# OpenTelemetry semantic conventions (stable HTTP and error attributes).
ERROR_TYPE = "error.type"
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
# This project's.
REQUEST_ID = "vllm_omni.request_id"
STAGE_ID = "vllm_omni.stage_id"
STAGE_NAME = "vllm_omni.stage.name"
STAGE_KIND = "vllm_omni.stage.kind"
CATEGORY = "vllm_omni.category"
STATUS_CODE = "vllm_omni.status_code"
FATAL = "vllm_omni.fatal"
RETRYABLE = "vllm_omni.retryable"
ERROR_PARAM = "vllm_omni.error.param"
ERROR_MESSAGE = "vllm_omni.error.message"
# Why the request or the stage's work ended without an answer:
# ``client_disconnect``, ``cancelled`` (a stage span: ``aborted``).
ABORT_REASON = "vllm_omni.abort_reason"
ABORTED = "vllm_omni.aborted"

Value = str | bool | int


def record_attributes(details: OmniErrorDetails) -> dict[str, Value]:
    """The record as attributes: owner, status, public type and text,
    ``param``, ``stage_id``, fatality and retry guidance, request id."""
    attributes: dict[str, Value] = {
        ERROR_TYPE: details.error_type,
        STATUS_CODE: details.status_code,
        CATEGORY: details.category,
        FATAL: details.fatal,
        RETRYABLE: should_retry(details),
        ERROR_MESSAGE: details.message,
    }
    if details.parameter is not None:
        attributes[ERROR_PARAM] = details.parameter
    if details.stage_id is not None:
        attributes[STAGE_ID] = details.stage_id
    if details.request_id is not None:
        attributes[REQUEST_ID] = details.request_id
    return attributes


def is_error(details: OmniErrorDetails) -> bool:
    """Whether the span of this failure has status ``ERROR``: the server
    failed (a client's mistake is recorded, not an error of the span)."""
    return details.category == "server"
