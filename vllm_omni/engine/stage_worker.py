"""A stage process: one stage, one asyncio loop, one ZMQ DEALER socket.

Runs each request as its own task and normalizes what the stage raises into
the record it sends (docs/runtime.md §3, docs/design.md §6). It must not
decide statuses, build envelopes or rebuild exceptions from records.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import zmq

from vllm_omni.config import (
    HEARTBEAT_INTERVAL_S,
    PipelineConfig,
    StageConfig,
    load_pipeline,
)
from vllm_omni.engine import liveness
from vllm_omni.engine.faults import apply_fault, matching_fault
from vllm_omni.engine.loop_socket import LoopSocket
from vllm_omni.engine.stage_metrics import keep_in
from vllm_omni.errors import OmniServiceUnavailableError, fatal_reason, normalize
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.logs import install_log_redaction
from vllm_omni.errors.sanitize import redact_credentials, warm_rule_set
from vllm_omni.stages import build_stage
from vllm_omni.stages.base import Stage
from vllm_omni.tracing.hooks import StageSpan, stage_span
from vllm_omni.tracing.provider import configure, flush
from vllm_omni.version import __version__
from vllm_omni.wire import hops
from vllm_omni.wire import messages as m

__all__ = [
    "LOG_FORMAT",
    "Cancellable",
    "StageStats",
    "WorkerSpec",
    "abort_request",
    "apply_instruction",
    "configure_logging",
    "log_failure",
    "main",
    "run_stage_process",
    "stage_identity",
    "stage_logger",
]

logger = logging.getLogger("vllm_omni.stage")

_WATCH_INTERVAL_S = 0.25
# How often a stage looks at its engine's fault-tolerance status: a fault is
# reported within this, not a heartbeat later.
_STATUS_POLL_S = 0.1
_RECENT = 1000  # request ids kept per stats list
_EXIT_LINGER_MS = 2000
# A pipe write of at most PIPE_BUF (4096) bytes is atomic: lines from several
# stages sharing one stderr never interleave mid-line.
_MAX_LOG_LINE = 4000
LOG_FORMAT = "%(asctime)s %(levelname)s stage-%(stage_id)s [%(request_id)s] %(message)s"
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar(
    "omni_stage_request_id", default="-"
)


def stage_identity(stage_id: int) -> bytes:
    """The ZMQ routing identity of a stage (the orchestrator's ROUTER sees it)."""
    return f"stage-{stage_id}".encode()


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a stage process needs; pickled to it through the launcher."""

    stage: StageConfig
    pipeline: PipelineConfig
    address: str
    # Local stages: exit when this process is gone.
    orchestrator_pid: int | None = None
    heartbeat_s: float = HEARTBEAT_INTERVAL_S
    # Remote stages: exit when the orchestrator has been silent this long.
    orchestrator_timeout_s: float | None = None
    # What the engine's process would show for ``vllm_omni.stage``.
    log_level: int = logging.INFO
    log_tracebacks: bool = True
    # Local stages: where this process keeps its metrics (``stage_metrics``).
    metrics_dir: str | None = None


@dataclasses.dataclass(slots=True)
class StageStats:
    """What a stage saw; returned by the ``stats`` utility (``report``)."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    aborts: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_RECENT)
    )
    cancelled: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_RECENT)
    )

    def report(
        self, stage: StageConfig, active: Iterable[str], compact: bool
    ) -> dict[str, Any]:
        """The ``stats`` utility's answer (``AsyncOmni.stage_stats``)."""
        return {
            "stage_id": stage.id,
            "name": stage.name,
            "kind": stage.kind,
            "pid": os.getpid(),
            "submitted": self.submitted,
            "completed": self.completed,
            "failed": self.failed,
            "active": sorted(active),
            "aborts": list(self.aborts),
            "cancelled": list(self.cancelled),
            "compact_errors": compact,
        }


class Cancellable(Protocol):
    """A request's running work: a task, or what stands for one
    (``engine.inline``'s request driven in its caller's task)."""

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...


def abort_request(
    stats: StageStats,
    tasks: Mapping[str, Cancellable],
    stage_id: int,
    request_id: str,
    log: logging.Logger = logger,
) -> None:
    """An abort reached a stage (its process, or in the orchestrator's): its
    running work is cancelled, counted, and logged in one line."""
    stats.aborts.append(request_id)
    task = tasks.get(request_id)
    running = task is not None and not task.done()
    if running:
        task.cancel()
        stats.cancelled.append(request_id)
    log.info(
        "stage %d: request %s aborted%s",
        stage_id,
        request_id,
        " (running work cancelled)" if running else "",
        extra={"request_id": request_id},
    )


def log_failure(
    stage_id: int,
    request_id: str,
    details: OmniErrorDetails,
    exc: BaseException,
    log: logging.Logger = logger,
) -> None:
    """The one line a stage logs when a request failed in it: the real text
    (and traceback) of a server error stays in the log. A faulted engine's
    refusal is expected until it recovers: the server logs it once at INFO
    (``errors.http.reporting``), the stage only at DEBUG, without traceback."""
    quiet = details.is_client or details.faulted
    level = logging.WARNING
    if quiet:
        level = logging.DEBUG if details.faulted else logging.INFO
    log.log(
        level,
        "stage %d request %s failed (%s %d)",
        stage_id,
        request_id,
        details.error_type,
        details.status_code,
        exc_info=None if quiet else exc,
        extra={"request_id": request_id},
    )


async def apply_instruction(
    stage: Stage,
    stage_id: int,
    instruction: str,
    params: dict[str, Any],
    request_id: str,
    log: logging.Logger = logger,
) -> dict[str, Any]:
    """A fault-tolerance instruction through ``stage.handle_fault``: its
    result, or, when it raised, a failure naming the exception's class and
    first line (the log has the rest)."""
    try:
        return dict(await stage.handle_fault(instruction, params, request_id))
    except Exception as exc:
        log.exception("stage %d: fault instruction %s failed", stage_id, instruction)
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        return {"request_id": request_id, "success": False, "reason": reason}


class StageWorker:
    """Serves one stage over a DEALER socket until shut down or orphaned."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.stage_id = spec.stage.id
        self._faults = spec.pipeline.faults_for(self.stage_id)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Fault-tolerance instructions being applied.
        self._calls: set[asyncio.Task[None]] = set()
        self._stats = StageStats()
        self._last_heard = time.monotonic()
        # Made in ``serve``, served by its loop.
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socket: LoopSocket | None = None
        # Shutdown was received: nothing after it is read.
        self._stopping = False
        self._stage: Stage | None = None
        self._exit_code = 0
        # Nobody waits for a stopping stage's heartbeats: close at once,
        # unless a fatal record is on its way out.
        self._linger_ms = 0
        # Compact error records only once the orchestrator said it reads them.
        self._compact = False
        # The engine status last sent, and when the last heartbeat left.
        self._reported: dict[str, Any] | None = None
        self._beaten = time.monotonic()
        # Stopped because the orchestrator is gone or was silent too long.
        self.orphaned = False

    # -- lifecycle -------------------------------------------------------------

    async def serve(self) -> int:
        """Run until ``Shutdown``, orphaning or a fatal error; the exit code."""
        self._context = zmq.Context()
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, stage_identity(self.stage_id))
        dealer.setsockopt(zmq.SNDHWM, 0)
        dealer.setsockopt(zmq.RCVHWM, 0)
        dealer.connect(self.spec.address)
        stop = asyncio.Event()
        self._socket = LoopSocket(dealer, functools.partial(self._on_frames, stop))
        # Only a main thread may; a Ray stage runs in its actor's default
        # concurrency group, a thread, and is stopped by Shutdown or ray.kill.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        # Watch from the start: building a stage (loading weights) can take long.
        loops = [asyncio.create_task(self._watch_orchestrator(stop))]
        try:
            if not await self._start_stage(stop):
                return self._exit_code
            # Read only once the stage serves: what came before waits in ZMQ.
            self._socket.start(asyncio.get_running_loop())
            loops.append(asyncio.create_task(self._heartbeat()))
            await stop.wait()
        finally:
            running = [*loops, *self._tasks.values(), *self._calls]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            if self._stage is not None:
                with contextlib.suppress(Exception):
                    await self._stage.shutdown()
        return self._exit_code

    async def _start_stage(self, stop: asyncio.Event) -> bool:
        """Build and start the stage, then announce it; False if it never will."""
        starting = asyncio.create_task(self._build_stage())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            return False
        error = starting.exception()
        if error is not None:
            logger.error("stage %d failed to start", self.stage_id, exc_info=error)
            lines = str(error).strip().splitlines()
            cause = f"{type(error).__name__}: {lines[0]}" if lines else ""
            failed = OmniServiceUnavailableError(cause or type(error).__name__)
            details = normalize(failed, stage_id=self.stage_id)
            self._send(m.ErrorMessage.from_details(details))
            self._exit_code, self._linger_ms = 1, _EXIT_LINGER_MS
            return False
        self._send(
            m.Ready(
                stage_id=self.stage_id,
                pid=os.getpid(),
                kind=self.spec.stage.kind,
                version=__version__,
                wire=1 if self.spec.stage.legacy_wire else m.WIRE_VERSION,
            )
        )
        return True

    async def _build_stage(self) -> None:
        self._stage = build_stage(self.spec.stage, self.spec.pipeline)
        await self._stage.start()

    def close(self) -> None:
        """Close the socket; waits up to the linger time for unsent messages
        only when something must still arrive (a fatal record)."""
        if self._socket is not None:
            self._socket.close(linger=self._linger_ms)
        if self._context is not None:
            self._context.term()

    # -- messages --------------------------------------------------------------

    def _send(self, message: m.Message) -> None:
        """Queue ``message`` to the orchestrator (never waits: no high-water
        mark, and a DEALER queues for a peer it is still connecting to)."""
        assert self._socket is not None
        data = m.encode(
            message, legacy_wire=self.spec.stage.legacy_wire, compact=self._compact
        )
        self._socket.send(data)

    def _on_frames(self, stop: asyncio.Event, frames: list[bytes]) -> None:
        """One message from the orchestrator (``LoopSocket`` calls it as it
        is read)."""
        if self._stopping or len(frames) != 1:
            return
        message = m.decode(frames[0])
        self._last_heard = time.monotonic()
        if isinstance(message, m.Submit):
            hops.mark(message.request_id, "stage.received", self.stage_id)
            self._submit(message)
        elif isinstance(message, m.Abort):
            self._abort(message.request_id)
        elif isinstance(message, m.Welcome):
            self._compact = message.wire >= m.WIRE_VERSION
        elif isinstance(message, m.UtilityRequest):
            if message.method == "handle_fault":
                task = asyncio.create_task(self._handle_fault(message))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
                return
            self._send(
                m.UtilityResponse(
                    call_id=message.call_id,
                    stage_id=self.stage_id,
                    result=self._utility(message.method),
                )
            )
        elif isinstance(message, m.Shutdown):
            self._stopping = True
            stop.set()

    def _submit(self, request: m.Submit) -> None:
        if request.request_id in self._tasks:
            logger.warning(
                "stage %d: duplicate request %s",
                self.stage_id,
                request.request_id,
                extra={"request_id": request.request_id},
            )
            return
        self._stats.submitted += 1
        task = asyncio.create_task(self._run(request), name=request.request_id)
        self._tasks[request.request_id] = task
        task.add_done_callback(functools.partial(self._forget, request.request_id))

    def _forget(self, request_id: str, task: asyncio.Task[None]) -> None:
        # Only this task: ``_ended`` may have let a new one take the id.
        if self._tasks.get(request_id) is task:
            del self._tasks[request_id]

    def _abort(self, request_id: str) -> None:
        abort_request(self._stats, self._tasks, self.stage_id, request_id)

    async def _handle_fault(self, call: m.UtilityRequest) -> None:
        """A fault-tolerance instruction (``apply_instruction``), answered."""
        assert self._stage is not None
        args = call.args
        result = await apply_instruction(
            self._stage,
            self.stage_id,
            str(args.get("instruction", "")),
            dict(args.get("params") or {}),
            str(args.get("request_id", "")),
        )
        # The status the instruction left goes ahead of its result: whoever
        # reads the result has read the engine's new status already.
        self._beat(self._fault_status())
        self._send(
            m.UtilityResponse(
                call_id=call.call_id, stage_id=self.stage_id, result=result
            )
        )

    def _utility(self, method: str) -> Any:
        if method == "hops":
            return hops.take()
        if method == "stats":
            return self._stats.report(self.spec.stage, self._tasks, self._compact)
        return {"error": f"unknown utility {method!r}"}

    # -- one request -----------------------------------------------------------

    async def _run(self, request: m.Submit) -> None:
        request_id = request.request_id
        hops.mark(request_id, "stage.started", self.stage_id)
        _request_id.set(request_id)  # this task's context only
        assert self._stage is not None
        stage = self.spec.stage
        span = stage_span(
            request_id,
            request.trace,
            stage_id=stage.id,
            name=stage.name,
            kind=stage.kind,
        )
        # The stage's engine continues this stage's span (a vllm stage).
        request.trace = span.headers(request.trace)
        try:
            fault = matching_fault(self._faults, request.prompt)
            if fault is not None:
                await apply_fault(fault)
            async for payload in self._stage.generate(request):
                hops.mark(request_id, "stage.payload", self.stage_id)
                self._send(
                    m.Output(
                        request_id=request_id, stage_id=self.stage_id, payload=payload
                    )
                )
                hops.mark(request_id, "stage.sent", self.stage_id)
            hops.mark(request_id, "stage.finished", self.stage_id)
            self._ended(request_id)
            self._stats.completed += 1
            span.finish()
            self._send(
                m.Output(request_id=request_id, stage_id=self.stage_id, finished=True)
            )
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                span.abort()
                raise  # an abort, a deadline or shutdown: no record
            self._fail(request_id, exc, span)
        except (KeyboardInterrupt, SystemExit):
            span.abort()
            raise
        except BaseException as exc:  # every other failure becomes a record
            self._fail(request_id, exc, span)

    def _ended(self, request_id: str) -> None:
        """The request's work is over: no longer active, before the message
        that says so leaves (whoever reads it may ask for ``stats`` next)."""
        self._tasks.pop(request_id, None)

    def _fail(self, request_id: str, exc: BaseException, span: StageSpan) -> None:
        """Send the request's error record (and put it on the request's stage
        span); the real text stays in this log."""
        hops.mark(request_id, "stage.failing", self.stage_id)
        self._stats.failed += 1
        details = normalize(exc, request_id=request_id, stage_id=self.stage_id)
        log_failure(self.stage_id, request_id, details, exc)
        span.fail(details)
        reason = fatal_reason(exc) if details.fatal else None
        record = m.ErrorMessage.from_details(details, reason=reason)
        hops.mark(request_id, "stage.failed", self.stage_id)
        self._ended(request_id)
        self._send(record)
        if details.fatal:
            self._die()

    def _die(self) -> None:
        logger.error("stage %d: fatal error, exiting", self.stage_id)
        flush()  # the failed span, before the process is gone
        # Closing with LINGER flushes the fatal record before the process ends.
        self._linger_ms = _EXIT_LINGER_MS
        self.close()
        os._exit(1)

    # -- liveness --------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """A heartbeat every ``heartbeat_s``, with the engine's fault-tolerance
        status when it has one; at once when that status changed (looked at
        every ``_STATUS_POLL_S``)."""
        while True:
            await asyncio.sleep(min(_STATUS_POLL_S, self.spec.heartbeat_s))
            status = self._fault_status()
            if status != self._reported or (
                time.monotonic() - self._beaten >= self.spec.heartbeat_s
            ):
                self._beat(status)

    def _beat(self, status: dict[str, Any] | None) -> None:
        """Send a heartbeat with the engine's status."""
        self._reported, self._beaten = status, time.monotonic()
        window = self._stage.recovery_window_s() if status and self._stage else None
        self._send(
            m.Heartbeat(
                stage_id=self.stage_id, engine_status=status, recovery_window_s=window
            )
        )

    def _fault_status(self) -> dict[str, Any] | None:
        """The stage's ``fault_status``; ``None`` when it has none, or when
        asking raised (logged: the stage's heartbeats must go on)."""
        if self._stage is None:
            return None
        try:
            status = self._stage.fault_status()
        except Exception:
            logger.exception("stage %d: fault_status failed", self.stage_id)
            return None
        return None if status is None else dict(status)

    async def _watch_orchestrator(self, stop: asyncio.Event) -> None:
        parent = os.getppid()
        pid = self.spec.orchestrator_pid
        timeout = self.spec.orchestrator_timeout_s
        previous = time.monotonic()
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            now = time.monotonic()
            paused = liveness.stalled(previous, now, _WATCH_INTERVAL_S)
            previous = now
            if paused:
                # Not the orchestrator's silence: see ``liveness``.
                self._last_heard = liveness.credited(self._last_heard, paused, now)
            orphaned = os.getppid() != parent or (pid is not None and not _alive(pid))
            silent = timeout is not None and now - self._last_heard > timeout
            if orphaned or silent:
                logger.warning(
                    "stage %d: orchestrator %s, exiting",
                    self.stage_id,
                    "gone" if orphaned else f"silent for {timeout:g} s",
                )
                self.orphaned = True
                stop.set()
                return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (vLLM's server runs on it too): every
    message and every request's task costs the stage's loop a turn, and
    uvloop's turns are the cheaper ones. Otherwise asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(spec: WorkerSpec) -> int:
    worker = StageWorker(spec)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(worker.serve())
    finally:
        worker.close()


class _StageLogFilter(logging.Filter):
    """Stamps every record with this stage's id and the current request id."""

    def __init__(self, stage_id: int) -> None:
        super().__init__()
        self.stage_id = stage_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.stage_id = self.stage_id
        if not hasattr(record, "request_id"):  # unless given with ``extra``
            record.request_id = _request_id.get()
        return True


class _OneLineFormatter(logging.Formatter):
    """A record is one line; without tracebacks an exception is its last line.
    With ``redact``, its credentials go too (for a process whose records are
    not redacted as they are made, see ``stage_logger``)."""

    def __init__(self, tracebacks: bool, redact: bool = False) -> None:
        super().__init__(LOG_FORMAT)
        self.tracebacks = tracebacks
        self.redact = redact

    def formatException(self, ei: Any) -> str:
        if self.tracebacks:
            return super().formatException(ei)
        return traceback.format_exception_only(ei[0], ei[1])[-1].strip()

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\r", "")
        if self.redact:
            text = redact_credentials(text)
        return text.replace("\n", " | ")


class _LineHandler(logging.Handler):
    """Writes each record to stderr with one ``os.write``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = self.format(record).encode("utf-8", "replace")[:_MAX_LOG_LINE]
            os.write(2, data + b"\n")
        except Exception:
            self.handleError(record)


def stage_logger(stage_id: int, level: int, tracebacks: bool) -> logging.Logger:
    """A logger that writes as a stage process does, for a stage that runs in
    the orchestrator's process (``engine.inline``): the same stamped line on
    stderr, the same level and traceback choice, credentials redacted; it
    does not pass its records to the caller's handlers, as a stage process's
    records never reach them."""
    log = logging.getLogger(f"vllm_omni.stage.inline.{stage_id}")
    handler = next((h for h in log.handlers if isinstance(h, _LineHandler)), None)
    if handler is None:
        handler = _LineHandler()
        handler.addFilter(_StageLogFilter(stage_id))
        log.addHandler(handler)
        log.propagate = False
    handler.setFormatter(_OneLineFormatter(tracebacks, redact=True))
    log.setLevel(level)
    return log


def configure_logging(stage_id: int, level: int, tracebacks: bool) -> None:
    """This process's logging: every record one stamped line on stderr, its
    credentials redacted."""
    install_log_redaction()
    handler = _LineHandler()
    handler.addFilter(_StageLogFilter(stage_id))
    handler.setFormatter(_OneLineFormatter(tracebacks))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # vLLM's own logger has its own handler; it follows the same level.
    logging.getLogger("vllm").setLevel(level)


def run_stage_process(spec: WorkerSpec) -> None:
    """Entry point of a local stage process (a fork of the launcher)."""
    # The orchestrator decides when stages stop; Ctrl-C in a terminal goes to
    # the whole process group and must not kill stages under a live engine.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(spec.stage.id, spec.log_level, spec.log_tracebacks)
    if spec.metrics_dir is not None:
        keep_in(spec.metrics_dir)  # before the engine creates its metrics
    warm_rule_set()  # the first failure's record must not wait for it
    configure(spec.pipeline.otlp_traces_endpoint, process=f"stage-{spec.stage.id}")
    code = _serve(spec)
    flush()  # os._exit skips atexit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one stage of a pipeline against a remote orchestrator."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "--connect", required=True, help="orchestrator address, tcp://…"
    )
    parser.add_argument("--pipeline", default="reference")
    parser.add_argument("--stage-id", type=int, required=True)
    parser.add_argument(
        "--orchestrator-timeout-s",
        type=float,
        default=30.0,
        help="exit when the orchestrator has not been heard from for this long "
        "(keep it at least twice the engine's heartbeat_timeout_s)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    args = parser.parse_args(argv)
    configure_logging(args.stage_id, getattr(logging, args.log_level.upper()), True)
    pipeline = load_pipeline(args.pipeline)
    # The operator's OTEL_* environment (or the pipeline's endpoint).
    configure(pipeline.otlp_traces_endpoint, process=f"stage-{args.stage_id}")
    spec = WorkerSpec(
        stage=pipeline.stage(args.stage_id),
        pipeline=pipeline,
        address=args.connect,
        orchestrator_timeout_s=args.orchestrator_timeout_s,
    )
    return _serve(spec)


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown of vLLM and torch (seconds): a stage
    # that gave up on its orchestrator is gone when it says so.
    flush()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
