"""The HTTP error boundary: every HTTP and WebSocket failure renders here.

``install_error_handling`` puts it on an app; routes use the request id and
the stream helpers below. Layering and the reasons for it: docs/design.md §4.1.
"""

from vllm_omni.errors.http.boundary import (
    ErrorBoundary,
    details_for_exception,
    install_error_handling,
    replayed,
    request_id_of,
    stream_error_details,
)
from vllm_omni.errors.http.schema import ERROR_RESPONSES

__all__ = [
    "ERROR_RESPONSES",
    "ErrorBoundary",
    "details_for_exception",
    "install_error_handling",
    "replayed",
    "request_id_of",
    "stream_error_details",
]
