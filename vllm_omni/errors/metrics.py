"""Error metrics (DESIGN §7), on the default registry the instrumentator uses.

Owns two counters and nothing else. Labels are bounded by construction: the
transport is one of a fixed set, category and code come from a validated
record, the type is the record's short identifier (from the status table or a
class), and the fallback label is an exception class name from a fixed table.
No message, id or path ever becomes a label.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter

from vllm_omni.errors.details import OmniErrorDetails

__all__ = ["ERRORS_TOTAL", "RAW_FALLBACKS_TOTAL", "Transport", "record_error"]

Transport = Literal["http", "sse", "websocket", "job", "offline"]

ERRORS_TOTAL = Counter(
    "vllm_omni:errors",
    "Errors rendered to clients, by transport, owner, public type and status.",
    ["transport", "category", "type", "code"],
)
RAW_FALLBACKS_TOTAL = Counter(
    "vllm_omni:raw_error_fallbacks",
    "Raw exceptions rendered by a legacy-mode fallback (ValueError → 400, …).",
    ["exception"],
)


def record_error(transport: Transport, details: OmniErrorDetails) -> None:
    ERRORS_TOTAL.labels(
        transport, details.category, details.error_type, str(details.status_code)
    ).inc()
