"""The record of a request that failed, the same for the boundary and streams.

Owns the sequence every failure of a request goes through: normalized and
accounted (``reporting``), named by the client's request id
(``request_ids``), and, when the engine may have died, stage-aware
termination (``termination``). Must not render: the caller picks the
transport.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import Scope

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.http.reporting import details_for_exception, error_mode
from vllm_omni.errors.http.request_ids import for_this_request, scope_request_id
from vllm_omni.errors.http.termination import ENGINE_FAILURES, terminate_if_errored
from vllm_omni.errors.normalizer import Mode

__all__ = ["failure_details", "stream_error_details"]


def failure_details(
    exc: BaseException, scope: Scope, *, app: Any, mode: Mode
) -> OmniErrorDetails:
    """The record for ``exc``, failing the request of ``scope`` on ``app``."""
    details = for_this_request(
        details_for_exception(exc, request_id=scope_request_id(scope), mode=mode),
        scope,
    )
    if isinstance(exc, ENGINE_FAILURES):
        terminate_if_errored(app, exc, details)
    return details


def stream_error_details(conn: HTTPConnection, exc: BaseException) -> OmniErrorDetails:
    """The record for a failure after headers went out (SSE, WebSocket).

    Same accounting as the boundary (log, fallback counter) and the same
    stage-aware termination on engine death; the caller renders the terminal
    event with ``render.sse_error_events`` / ``render.ws_error_event``.
    """
    return failure_details(exc, conn.scope, app=conn.app, mode=error_mode(conn.app))
