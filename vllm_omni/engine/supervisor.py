"""Starts and stops a pipeline's stages and watches them: readiness,
heartbeats, silence and death (docs/design.md §6)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
import weakref

from vllm_omni.config import HEARTBEAT_INTERVAL_S, PipelineConfig, StageConfig
from vllm_omni.engine import liveness, processes
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
from vllm_omni.engine.stage_worker import WorkerSpec
from vllm_omni.errors import (
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    fatal_reason,
    normalize,
)
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import (
    ENGINE_DEAD,
    EVENT_LOOP_LAG,
    STAGE_FAULTED_SECONDS,
    STAGE_RECOVERY_WINDOW,
    STAGE_STATUS,
    StageStatus,
    set_stage_status,
)
from vllm_omni.version import __version__
from vllm_omni.wire import messages as m

__all__ = ["Supervisor"]

logger = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.1


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
    """The stages' lives: they start (or the engine never runs), they are
    heard from, and when one dies the engine is dead for every request."""

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
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # None: a stage is never silent, only dead after heartbeat_timeout_s.
        self.silence_timeout_s = silence_timeout_s
        self.death_grace_s = death_grace_s
        self.handles: dict[int, StageHandle] = {}
        self.dead: OmniEngineDeadError | None = None
        # The launcher's control plane does not answer: admission refuses.
        self.unreachable = False
        self.started = False
        self.closed = False
        self._requests = requests
        self._tasks: list[asyncio.Task[None]] = []
        self._finalizer: weakref.finalize | None = None
        self.recovery = Recovery(
            self.handles,
            channel,
            requests,
            serving=lambda: not self.closed and self.dead is None,
            mark_dead=self.mark_dead,
            publish=self.publish,
            status_of=self.status_of,
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
                        exited=self._on_stage_exit,
                        answering=self._on_stage_answering,
                        reachable=self._on_reachable,
                    ),
                )
            # A stage in this process may hold the loop while it starts (a
            # vllm stage builds its AsyncLLM, as ``vllm serve`` does): the
            # watch starts after it, so that a start that awaits before it
            # blocks is not counted as a pause of this process (the stage
            # processes start meanwhile; one that died is seen at the
            # watch's first tick).
            await self._start_inline()
            self._tasks.append(asyncio.create_task(self._watch(), name="omni-watch"))
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
        for task in [*self._tasks, *self.recovery.tasks]:
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

    # -- liveness --------------------------------------------------------------

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = previous = loop.time()
        while self.dead is None and not self.closed:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            now = loop.time()
            EVENT_LOOP_LAG.observe(max(0.0, now - previous - _WATCH_INTERVAL_S))
            paused = liveness.stalled(previous, now, _WATCH_INTERVAL_S)
            previous = now
            if paused:
                # Not the stages' silence: see ``liveness``.
                logger.warning(
                    "the orchestrator did not run for %.1f s (process or machine "
                    "paused); stage silence over that time is not counted",
                    paused,
                )
                for handle in self.handles.values():
                    handle.last_seen = liveness.credited(handle.last_seen, paused, now)
            for handle in self.handles.values():
                if await self._watch_one(handle, now):
                    return
            if now >= next_beat:
                next_beat = now + HEARTBEAT_INTERVAL_S
                for handle in self.handles.values():
                    if self._watched_by_heartbeat(handle):
                        self.channel.post(handle, m.Heartbeat())

    async def _watch_one(self, handle: StageHandle, now: float) -> bool:
        """One tick for one stage; True once the engine is dead."""
        death = handle.inline.health() if handle.inline is not None else None
        if death is not None:
            # In this process: its engine died (no process to exit).
            self.mark_dead(handle.config.id, fatal_reason(death))
            return True
        if handle.inline is not None:
            self.recovery.on_engine_status(handle, *handle.inline.fault_status())
            if self.dead is not None:
                return True
        self.recovery.watch(handle, now)
        process = handle.process
        if process is not None and not process.is_alive():
            # Let the receiver deliver a fatal record sent just before exit.
            await asyncio.sleep(self.death_grace_s)
            self.mark_dead(
                handle.config.id, f"stage process exited with code {process.exitcode}"
            )
            return True
        if self._watched_by_heartbeat(handle) and handle.ready.done():
            unheard = now - handle.last_seen
            if unheard > self.heartbeat_timeout_s:
                self.mark_dead(handle.config.id, "stage heartbeat lost")
                return True
            if self.silence_timeout_s is not None:
                self._set_silent(
                    handle,
                    "heartbeat",
                    unheard > self.silence_timeout_s,
                    f"not heard from for {unheard:.1f} s",
                )
        return False

    def _watched_by_heartbeat(self, handle: StageHandle) -> bool:
        return handle.config.remote or self.launcher is not None

    def _on_stage_exit(self, stage_id: int, reason: str) -> None:
        """A launched stage stopped (the launcher's liveness source)."""

        async def mark() -> None:
            # Let the receiver deliver a fatal record sent just before exit.
            await asyncio.sleep(self.death_grace_s)
            self.mark_dead(stage_id, reason)

        self._tasks.append(asyncio.create_task(mark(), name=f"omni-exit-{stage_id}"))

    def _on_stage_answering(self, stage_id: int, answering: bool) -> None:
        """A launched stage's probe changed (docs/design.md §6)."""
        self._set_silent(
            self.handles[stage_id], "probe", not answering, "its probe got no answer"
        )

    def _set_silent(
        self, handle: StageHandle, source: str, silent: bool, why: str
    ) -> None:
        """``source`` says the stage is silent (or no longer); on the change of
        the stage's state, fail what it holds, or admit again."""
        was = handle.silent
        if silent:
            handle.silent_by.add(source)
        else:
            handle.silent_by.discard(source)
        if handle.silent == was or self.closed or self.dead is not None:
            return
        self.publish(handle)
        stage_id, name = handle.config.id, handle.config.name
        if not silent:
            logger.info("stage %d (%s) answers again: admitting", stage_id, name)
            return
        logger.warning(
            "stage %d (%s) does not answer (%s): %d request(s) in flight there "
            "fail with 504, new ones for it are refused with 503",
            stage_id,
            name,
            why,
            len(self._requests.at_stage(stage_id)),
        )
        self._requests.fail_at_stage(
            stage_id,
            lambda: OmniStageTimeoutError(
                f"Stage {stage_id} ({name}) stopped answering.", stage_id=stage_id
            ),
            "timeout",
        )

    def _on_reachable(self, reachable: bool) -> None:
        """The launcher's control plane changed (docs/design.md §6)."""
        if self.unreachable is not reachable:
            return
        self.unreachable = not reachable
        if reachable:
            logger.info("the stages' cluster answers again: admitting")
        else:
            logger.warning(
                "the stages' cluster does not answer: new requests are refused "
                "with 503, admitted ones go on"
            )

    # -- admission checks ------------------------------------------------------

    def check_serving(self, request_id: str | None = None) -> None:
        """Refuse while the engine is dead (its error) or not running (503)."""
        if self.dead is not None:
            raise self.dead_error_for(request_id)
        if not self.started or self.closed:
            raise OmniServiceUnavailableError("The engine is not running.")

    def check_reachable(self, first: StageConfig) -> None:
        """Refuse a new request while the launcher's control plane is down."""
        if self.unreachable:
            raise OmniServiceUnavailableError(
                f"Stage {first.id} ({first.name}) cannot be reached; retry later.",
                stage_id=first.id,
            )

    def check_answering(self, stage: StageConfig, request_id: str | None) -> None:
        """Refuse a request that needs ``stage`` while the stage is silent
        (503) or its engine faulted (``Recovery.refuse``)."""
        handle = self.handles[stage.id]
        if handle.silent:
            raise OmniServiceUnavailableError(
                f"Stage {stage.id} ({stage.name}) is not answering; retry later.",
                stage_id=stage.id,
            )
        if handle.fault.faulted:
            self.recovery.refuse(handle, request_id)

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
        """This engine's stages leave ``/metrics`` when it shuts down."""
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
