"""Error and outcome metrics (docs/design.md §7, §9), on the default registry the
instrumentator uses.

Owns the counters an on-call alerts on: rendered errors, legacy fallbacks,
aborts by reason, admission rejections, faulted-engine refusals and stage
recoveries, plus the gauges (requests in flight, engine dead, each stage's
status, how long a stage has been faulted and its recovery window) and the
lag of the engine's event loop (the API server's under ``vllm-omni serve``),
whose stalls delay every heartbeat and token. Labels are bounded by
construction: the transport is one of a fixed set, category and code come
from a validated record, the type is the record's short identifier (from the
status table or a class), the fallback label is an exception class name from
a fixed table, abort and admission reasons, stage statuses and recovery
outcomes are literals, and a ``stage`` label is a stage id from the pipeline
file. No message, request id or path ever becomes a label.

It also owns the abort context: a transport that knows *why* a request is
being cancelled (the HTTP boundary saw the client go away) says so here, and
the engine, which does the abort, counts it with that reason. ``errors/`` is
the ground layer, so both can import it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
from typing import Literal, get_args

from prometheus_client import Counter, Gauge, Histogram

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.outcome import note

__all__ = [
    "ABORTS_TOTAL",
    "ADMISSION_REJECTIONS_TOTAL",
    "ENGINE_DEAD",
    "ENGINE_WIDE",
    "ERRORS_TOTAL",
    "EVENT_LOOP_LAG",
    "FAULTED_REFUSALS_TOTAL",
    "RAW_FALLBACKS_TOTAL",
    "REQUESTS_IN_FLIGHT",
    "STAGE_FAULTED_SECONDS",
    "STAGE_RECOVERIES_TOTAL",
    "STAGE_RECOVERY_WINDOW",
    "STAGE_STATUS",
    "AbortContext",
    "AbortReason",
    "RecoveryOutcome",
    "StageStatus",
    "Transport",
    "abort_context",
    "kept_in_files",
    "record_abort",
    "record_abort_of",
    "record_error",
    "set_abort_context",
    "set_stage_status",
]

Transport = Literal["http", "sse", "websocket", "job", "offline"]

# The ``stage`` label of a limit that is not a stage's own (the engine's).
ENGINE_WIDE = ""

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


# ``ERRORS_TOTAL``'s series by their labels: ``labels()`` validates and
# locks on every call (about 3 µs), a dictionary hit costs a tenth of that.
# As many entries as the counter has series.
_ERROR_SERIES: dict[tuple[str, str, str, int], Counter] = {}


def record_error(transport: Transport, details: OmniErrorDetails) -> None:
    """Count one rendered error, and note it on its request's outcome
    (``errors.outcome``: what a trace of the request shows)."""
    note(details)
    key = (transport, details.category, details.error_type, details.status_code)
    series = _ERROR_SERIES.get(key)
    if series is None:
        series = _ERROR_SERIES[key] = ERRORS_TOTAL.labels(
            transport, details.category, details.error_type, str(details.status_code)
        )
    series.inc()
    if details.faulted:
        stage = ENGINE_WIDE if details.stage_id is None else str(details.stage_id)
        FAULTED_REFUSALS_TOTAL.labels(stage).inc()


# Why a request was aborted in every stage: the client went away (any
# transport), its consumer was cancelled or closed (offline callers, Ctrl-C),
# someone called ``abort()``, or a stage missed its deadline.
AbortReason = Literal["client_disconnect", "cancelled", "abort", "timeout"]

ABORTS_TOTAL = Counter(
    "vllm_omni:aborts",
    "Requests aborted in every stage, by reason; client disconnects are not errors.",
    ["reason"],
)
ADMISSION_REJECTIONS_TOTAL = Counter(
    "vllm_omni:admission_rejections",
    "Requests refused at admission with QueueOverflowError (503), by limit and "
    "stage (the stage id for a stage's limit, \"\" for the engine's).",
    ["reason", "stage"],
)
FAULTED_REFUSALS_TOTAL = Counter(
    "vllm_omni:engine_faulted_refusals",
    "Requests refused because an engine had faulted and was recovering "
    '(vLLM 0.34\'s EngineFaultedError, 503), by stage ("" when no stage '
    "was named).",
    ["stage"],
)
# With several API server processes (``--api-server-count``) every process
# keeps its metrics in prometheus_client's multiprocess files and ``/metrics``
# sums them; the gauges are the engine process's alone, so the live process's
# value is the value (no ``pid`` label).
_ENGINE_PROCESS = "livesum"

REQUESTS_IN_FLIGHT = Gauge(
    "vllm_omni:requests_in_flight",
    "Requests admitted by the engine and not yet finished.",
    multiprocess_mode=_ENGINE_PROCESS,
)
ENGINE_DEAD = Gauge(
    "vllm_omni:engine_dead",
    "1 once a stage died or failed fatally, until a new engine starts; else 0.",
    multiprocess_mode=_ENGINE_PROCESS,
)
# A stage's status as the orchestrator sees it: serving (``healthy``), not
# heard from (``silent``), its engine faulted (vLLM 0.34's ``diagnosing`` and
# ``unhealthy``), or ``dead`` (the stage that killed the engine).
StageStatus = Literal["healthy", "silent", "diagnosing", "unhealthy", "dead"]
RecoveryOutcome = Literal["succeeded", "failed"]

STAGE_STATUS = Gauge(
    "vllm_omni:stage_status",
    "Each stage's status, one series per status: 1 for the current one "
    "(healthy, silent, diagnosing, unhealthy, dead), 0 for the others.",
    ["stage", "status"],
    multiprocess_mode=_ENGINE_PROCESS,
)
STAGE_FAULTED_SECONDS = Gauge(
    "vllm_omni:stage_faulted_seconds",
    "How long the stage's engine has been faulted (diagnosing or unhealthy) in "
    "its current fault; 0 while it is not.",
    ["stage"],
    multiprocess_mode=_ENGINE_PROCESS,
)
STAGE_RECOVERY_WINDOW = Gauge(
    "vllm_omni:stage_recovery_window_seconds",
    "The recovery window of a stage whose engine runs fault tolerance (vLLM's "
    "engine_recovery_timeout_sec): faulted longer, the engine gives up.",
    ["stage"],
    multiprocess_mode=_ENGINE_PROCESS,
)
STAGE_RECOVERIES_TOTAL = Counter(
    "vllm_omni:stage_recoveries",
    "Recovery instructions a stage's faulted engine answered, by outcome.",
    ["stage", "outcome"],
)
EVENT_LOOP_LAG = Histogram(
    "vllm_omni:event_loop_lag_seconds",
    "How late the engine's event loop (the API server's under vllm-omni serve) "
    "ran a timer: every request, stream and heartbeat on it waited as long.",
    # From a busy loop's few milliseconds to the pauses the stall rule
    # (liveness.STALL_TOLERANCE_S, 1 s) credits to stages.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
# Every series exists from the start, so rate() and absent() work at once.
for _reason in get_args(AbortReason):
    ABORTS_TOTAL.labels(_reason)
ADMISSION_REJECTIONS_TOTAL.labels("max_num_queued_reqs", ENGINE_WIDE)


def kept_in_files() -> bool:
    """Whether this process keeps its metrics in multiprocess files (one of
    several processes behind ``/metrics``), where a series cannot be removed."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ


def set_stage_status(stage: str, status: StageStatus) -> None:
    """Make ``status`` the stage's current one (``STAGE_STATUS``)."""
    for each in get_args(StageStatus):
        STAGE_STATUS.labels(stage, each).set(1 if each == status else 0)


@dataclasses.dataclass(slots=True)
class AbortContext:
    """What a transport knows about the cancellation of its current request."""

    reason: AbortReason | None = None
    # Set once the abort was counted, so one request counts once.
    counted: bool = False


_ABORT_CONTEXT: contextvars.ContextVar[AbortContext | None] = contextvars.ContextVar(
    "vllm_omni_abort_context", default=None
)


def abort_context() -> AbortContext | None:
    """The current request's abort context, if a transport set one."""
    return _ABORT_CONTEXT.get()


def set_abort_context(context: AbortContext) -> None:
    """Attach ``context`` to the current task (and tasks it starts later)."""
    _ABORT_CONTEXT.set(context)


def record_abort(default: AbortReason) -> None:
    """Count one abort: with the transport's reason when it gave one."""
    record_abort_of(_ABORT_CONTEXT.get(), default)


def record_abort_of(context: AbortContext | None, default: AbortReason) -> None:
    """``record_abort`` for the request whose abort context is ``context``
    (``None``: a request no transport follows)."""
    if context is None:
        ABORTS_TOTAL.labels(default).inc()
        return
    if context.counted:
        return
    context.counted = True
    ABORTS_TOTAL.labels(context.reason or default).inc()
