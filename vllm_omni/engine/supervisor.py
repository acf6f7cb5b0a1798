"""Starts and stops a pipeline's stages, and declares the engine dead when
one of them dies (docs/design.md §6)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
import weakref

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine import processes
from vllm_omni.engine.inline import InlineStage, runs_inline
from vllm_omni.engine.processes import LauncherError, Lease, StageProcess
from vllm_omni.engine.recovery import Recovery
from vllm_omni.engine.request_table import RequestTable
from vllm_omni.engine.stage_channel import StageChannel
from vllm_omni.engine.stage_handle import (
    LauncherHooks,
    StageHandle,
    StageLauncher,
    StageStartupError,
)
from vllm_omni.engine.stage_metrics import STAGE_METRICS, StageDirectories
from vllm_omni.engine.stage_watch import StageWatch
from vllm_omni.engine.stage_worker import WorkerSpec
from vllm_omni.errors import (
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    normalize,
)
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import (
    ENGINE_DEAD,
    STAGE_FAULTED_SECONDS,
    STAGE_RECOVERY_WINDOW,
    STAGE_STATUS,
    StageStatus,
    kept_in_files,
    set_stage_status,
)
from vllm_omni.version import __version__
from vllm_omni.wire import messages as m

__all__ = ["Supervisor"]

logger = logging.getLogger(__name__)


def _stage_log_settings() -> tuple[int, bool]:
    """The level and traceback choice for stage logs, from this process's
    ``logging`` configuration of ``vllm_omni.stage``: a caller that configured
    nothing (no handler anywhere) gets warnings only, without tracebacks."""
    stage_logger = logging.getLogger("vllm_omni.stage")
    level = stage_logger.getEffectiveLevel()
    if not stage_logger.hasHandlers():
        return max(level, logging.WARNING), False
    return level, True


def _reap(
    started: list[StageProcess],
    lease: Lease,
    ipc_dir: str | None,
    metrics: StageDirectories,
) -> None:
    """Last resort (GC, interpreter exit): no stage outlives its engine; the
    launcher closes with its last lease. Also the end of every shutdown: the
    stages' metrics leave ``/metrics`` and their files the disk."""
    for process in started:
        with contextlib.suppress(Exception):
            if process.is_alive():
                process.kill()
                process.join(1.0)
    lease.release()
    STAGE_METRICS.remove(metrics)
    shutil.rmtree(metrics.root, ignore_errors=True)
    if ipc_dir is not None:
        shutil.rmtree(ipc_dir, ignore_errors=True)


class Supervisor:
    """The stages' lives: they start (or the engine never runs), their
    ``StageWatch`` hears them, and when one dies the engine is dead for every
    request."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        channel: StageChannel,
        requests: RequestTable,
        *,
        launcher: StageLauncher | None,
        startup_timeout_s: float,
        heartbeat_timeout_s: float,
        silence_timeout_s: float | None,
        death_grace_s: float,
    ) -> None:
        self.pipeline = pipeline
        self.channel = channel
        self.launcher = launcher
        self.startup_timeout_s = startup_timeout_s
        self.handles: dict[int, StageHandle] = {}
        self.dead: OmniEngineDeadError | None = None
        self.started = False
        self.closed = False
        self._requests = requests
        self._finalizer: weakref.finalize | None = None
        self.recovery = Recovery(
            self.handles,
            channel,
            requests,
            serving=self.serving,
            mark_dead=self.mark_dead,
            publish=self.publish,
            status_of=self.status_of,
        )
        self.watch = StageWatch(
            self.handles,
            channel,
            requests,
            self.recovery,
            launched=launcher is not None,
            heartbeat_timeout_s=heartbeat_timeout_s,
            silence_timeout_s=silence_timeout_s,
            death_grace_s=death_grace_s,
            serving=self.serving,
            mark_dead=self.mark_dead,
            publish=self.publish,
        )

    # -- startup and shutdown -------------------------------------------------

    async def start(self) -> None:
        """Bind, start the stages, and wait until every stage is ready."""
        loop = asyncio.get_running_loop()
        for stage in self.pipeline.stages:
            self.handles[stage.id] = StageHandle(stage, loop)
        self.channel.open(self.handles.values())
        try:
            if self.launcher is not None:
                self.channel.host = await asyncio.to_thread(self.launcher.prepare)
            address = self.channel.bind(loop)
            if self.launcher is None:
                await asyncio.to_thread(self._spawn_local)
            else:
                await self.launcher.launch(
                    self.pipeline,
                    address,
                    LauncherHooks(
                        exited=self.watch.on_exit,
                        answering=self.watch.on_answering,
                        reachable=self.watch.on_reachable,
                    ),
                )
            # A stage in this process may hold the loop while it starts (a
            # vllm stage builds its AsyncLLM, as ``vllm serve`` does): the
            # watch starts after it, so that a start that awaits before it
            # blocks is not counted as a pause of this process (the stage
            # processes start meanwhile; one that died is seen at the
            # watch's first tick).
            await self._start_inline()
            self.watch.tasks.append(
                asyncio.create_task(self.watch.run(), name="omni-watch")
            )
            for handle in self.handles.values():
                if handle.config.remote:
                    logger.warning(
                        "waiting for remote stage %d: python -m "
                        "vllm_omni.engine.stage_worker --connect %s --pipeline %s "
                        "--stage-id %d",
                        handle.config.id,
                        address,
                        self.pipeline.source,
                        handle.config.id,
                    )
            async with asyncio.timeout(self.startup_timeout_s):
                await asyncio.gather(*(h.ready for h in self.handles.values()))
        except TimeoutError:
            # The timeout cancelled the ready futures it waited for: a stage
            # that was ready has a result.
            waiting = [
                h.config
                for h in self.handles.values()
                if h.ready.cancelled() or not h.ready.done()
            ]
            self.shutdown()
            cause = f"not ready within {self.startup_timeout_s:g} s"
            if waiting[0].remote:
                cause += " (no remote worker connected)"
            if len(waiting) > 1:
                others = ", ".join(str(stage.id) for stage in waiting[1:])
                cause += f"; stages {others} were not ready either"
            raise StageStartupError(waiting[0], cause) from None
        except BaseException:
            self.shutdown()
            raise
        self.started = True
        ENGINE_DEAD.set(0)
        for handle in self.handles.values():
            self.publish(handle)

    async def _start_inline(self) -> None:
        """Build and start the stages that run in this process (``inline``);
        one that cannot start is that stage's startup error, as from a stage
        process."""
        local = self.launcher is None
        level, tracebacks = _stage_log_settings()
        for handle in self.handles.values():
            stage = handle.config
            if not runs_inline(stage, self.pipeline, local):
                continue
            try:
                handle.inline = InlineStage(
                    stage, self.pipeline, log_level=level, log_tracebacks=tracebacks
                )
                await handle.inline.start()
            except Exception as error:
                if handle.inline is not None:
                    handle.inline.close()
                lines = str(error).strip().splitlines()
                self._fail_start(
                    stage, f"{type(error).__name__}: {lines[0]}" if lines else ""
                )
                return
            handle.ready.set_result(
                m.Ready(
                    stage_id=stage.id,
                    pid=os.getpid(),
                    kind=stage.kind,
                    version=__version__,
                    wire=m.WIRE_VERSION,
                )
            )
            if handle.inline.exports_metrics:
                STAGE_METRICS.add(handle.inline)
            logger.info(
                "stage %d (%s) ready in the orchestrator's process",
                stage.id,
                stage.kind,
            )

    def _spawn_local(self) -> None:
        """Start local stage processes (in a thread: the first start waits for
        the launcher to import vLLM)."""
        lease = processes.acquire()
        started: list[StageProcess] = []
        metrics = StageDirectories(tempfile.mkdtemp(prefix="vllm-omni-metrics-"))
        self._finalizer = weakref.finalize(
            self, _reap, started, lease, self.channel.ipc_dir, metrics
        )
        STAGE_METRICS.add(metrics)
        level, tracebacks = _stage_log_settings()
        for handle in self.handles.values():
            if handle.config.remote or runs_inline(handle.config, self.pipeline, True):
                continue
            spec = WorkerSpec(
                stage=handle.config,
                pipeline=self.pipeline,
                address=self.channel.address,
                orchestrator_pid=os.getpid(),
                log_level=level,
                log_tracebacks=tracebacks,
                metrics_dir=metrics.directory(handle.config.id),
            )
            name = f"omni-stage-{handle.config.id}-{handle.config.name}"
            try:
                process = lease.start_stage(spec, name)
            except LauncherError as exc:
                raise StageStartupError(handle.config, str(exc)) from None
            handle.process = process
            started.append(process)
            metrics.add(handle.config.id, process.is_alive)

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Stop every stage and release sockets; idempotent. Call it from the
        engine's loop thread (or after that loop stopped)."""
        if self.closed:
            return
        self.closed = True
        self.channel.broadcast(m.Shutdown())
        self._requests.close_all(
            lambda request: OmniServiceUnavailableError("The engine is shutting down.")
        )
        for task in [*self.watch.tasks, *self.recovery.tasks]:
            # A dropped engine may be finalized after its loop closed.
            with contextlib.suppress(RuntimeError):
                task.cancel()
        if self.started:
            self._unpublish()
        for handle in self.handles.values():
            if handle.ready.done() and not handle.ready.cancelled():
                handle.ready.exception()  # retrieved: a failed start already raised
        for handle in self.handles.values():
            if handle.inline is not None:
                handle.inline.close()
                STAGE_METRICS.remove(handle.inline)
        deadline = time.monotonic() + timeout_s
        for handle in self.handles.values():
            if handle.process is not None:
                handle.process.join(max(0.0, deadline - time.monotonic()))
                if handle.process.is_alive():
                    handle.process.terminate()
                    handle.process.join(1.0)
        if self.launcher is not None:
            self.launcher.stop(max(0.0, deadline - time.monotonic()))
        self.channel.close()
        if self._finalizer is not None:
            self._finalizer()
        else:
            self.channel.remove_ipc_dir()

    # -- what stages say -------------------------------------------------------

    def on_ready(self, handle: StageHandle, message: m.Ready) -> None:
        handle.pid = message.pid
        if message.wire >= m.WIRE_VERSION:
            # The stage may now drop the 0.30 duplicate fields.
            self.channel.post(handle, m.Welcome(wire=m.WIRE_VERSION))
        if not handle.ready.done():
            handle.ready.set_result(message)
        logger.info(
            "stage %d (%s) ready, pid %d", message.stage_id, message.kind, message.pid
        )

    def on_stage_error(
        self, handle: StageHandle, details: OmniErrorDetails, reason: str | None
    ) -> bool:
        """A record about the stage itself (its startup failed, or a fatal
        one); False for a record that fails only its request."""
        if details.request_id is None and not handle.ready.done():
            # The stage's startup record: the cause, before its process exits.
            self._fail_start(handle.config, details.message)
            return True
        if details.fatal:
            self.mark_dead(
                handle.config.id, reason or "the stage reported a fatal error"
            )
            return True
        return False

    # -- admission checks ------------------------------------------------------

    def check_serving(self, request_id: str | None = None) -> None:
        """Refuse while the engine is dead (its error) or not running (503)."""
        if self.dead is not None:
            raise self.dead_error_for(request_id)
        if not self.started or self.closed:
            raise OmniServiceUnavailableError("The engine is not running.")

    def serving(self) -> bool:
        """Started or starting, not dead and not shut down."""
        return not self.closed and self.dead is None

    # -- status and death ------------------------------------------------------

    def status_of(self, handle: StageHandle) -> StageStatus:
        if self.dead is not None and self.dead.stage_id == handle.config.id:
            return "dead"
        if handle.silent:
            return "silent"
        state = handle.fault.state
        return state if handle.fault.faulted else "healthy"  # type: ignore[return-value]

    def publish(self, handle: StageHandle) -> None:
        """The stage's status on ``/metrics`` (``vllm_omni:stage_status``)."""
        set_stage_status(str(handle.config.id), self.status_of(handle))

    def _unpublish(self) -> None:
        """This engine's stages leave ``/metrics`` when it shuts down (with
        several API server processes the server stops with its engine, and
        their files go with it)."""
        if kept_in_files():
            return
        for stage_id in self.handles:
            labels = str(stage_id)
            for metric in (STAGE_FAULTED_SECONDS, STAGE_RECOVERY_WINDOW):
                with contextlib.suppress(KeyError):
                    metric.remove(labels)
            for status in ("healthy", "silent", "diagnosing", "unhealthy", "dead"):
                with contextlib.suppress(KeyError):
                    STAGE_STATUS.remove(labels, status)

    def dead_error_for(self, request_id: str | None) -> OmniEngineDeadError:
        """A fresh dead error for one request (each raise gets its own)."""
        assert self.dead is not None
        return OmniEngineDeadError(
            stage_id=self.dead.stage_id,
            reason=self.dead.reason,
            details=normalize(self.dead, request_id=request_id),
        )

    def _fail_start(self, stage: StageConfig, cause: str) -> None:
        """A stage failed before the engine ran: ``start`` raises the first
        such error (every waiting stage gets it, so nothing is left pending)."""
        waiting = [h for h in self.handles.values() if not h.ready.done()]
        if not waiting:
            return
        logger.error("stage %d (%s) failed to start: %s", stage.id, stage.name, cause)
        error = StageStartupError(stage, cause)
        for handle in waiting:
            handle.ready.set_exception(error)

    def mark_dead(self, stage_id: int, reason: str) -> None:
        """The stage died (or reported a fatal error): the engine is dead."""
        if self.dead is not None or self.closed:
            return
        if not self.started:
            self._fail_start(self.handles[stage_id].config, reason)
            return
        dead = OmniEngineDeadError(stage_id=stage_id, reason=reason)
        dead.details = normalize(dead)
        self.dead = dead
        ENGINE_DEAD.set(1)
        if stage_id in self.handles:
            self.publish(self.handles[stage_id])
        # The one log line of this death; requests refused later log at INFO.
        logger.critical(
            "engine dead: stage %d (%s) failed fatally: %s",
            stage_id,
            self.handles[stage_id].config.name
            if stage_id in self.handles
            else "unknown",
            reason,
        )
        # Every in-flight request, the one that triggered a fatal record
        # included, gets the same error with the reason and its own id.
        self._requests.close_all(lambda request: self.dead_error_for(request.wire_id))
        for handle in self.handles.values():
            if handle.inline is not None:
                handle.inline.cancel_all()  # as a dead stage process stops
            if not handle.ready.done():
                handle.ready.set_exception(self.dead_error_for(None))
        self.channel.answer_all()
