"""The HTTP error boundary: every HTTP and WebSocket failure renders here.

``install_error_handling`` puts it on an app; routes use the request id and
the helpers below. Layers and the reasons for them: docs/design.md §4.1.
"""

from vllm_omni.errors.http.boundary import ErrorBoundary
from vllm_omni.errors.http.failures import stream_error_details
from vllm_omni.errors.http.register import install_error_handling
from vllm_omni.errors.http.reporting import details_for_exception, replayed
from vllm_omni.errors.http.request_ids import request_id_of
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
