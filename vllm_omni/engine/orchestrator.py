"""The orchestrator: moves each request through its stages and owns their fate.

Owns the orchestrator side of the stage wire (docs/design.md §6): it starts the
stage processes (forks of one launcher process, see ``processes.py``),
binds one ZMQ ROUTER socket (``ipc://`` under a private temp dir by default,
``tcp://`` for stages on other hosts), routes each request along the chain
of stages that produce the requested modalities, and turns what comes back
into results or exceptions:

- an ``ErrorMessage`` is read with ``OmniErrorDetails.from_wire`` and
  rebuilt by ``category`` with ``to_exception`` (``stage_failure``: marked
  as logged by the stage, which logged its cause); a nonfatal one fails only
  its request (``OmniEngineGenerateError`` with ``stage_id`` for a stage's
  internal failure, the remote ``OmniClientError`` for a client error);
- a per-stage deadline (``timeout_s``) fails the request with
  ``OmniStageTimeoutError`` (504) and aborts it in every stage;
- a fatal record, or a stage process that died (polled every 100 ms), marks
  the engine dead: every in-flight request fails with
  ``OmniEngineDeadError(stage_id=…)`` and new ones are refused;
- a stage on another host (``remote``, or started by a launcher) is watched
  by its heartbeats: not heard from for ``silence_timeout_s`` it is
  *silent* (below), heard again it is not; not heard from for
  ``heartbeat_timeout_s`` it is dead (a partition that long, or a host
  gone);
- a consumer that goes away (``CancelledError``/``GeneratorExit``) aborts the
  request in every stage; that is not an error;
- until every stage is ready, any failure (a stage's startup record, a stage
  or the launcher exiting) is a ``StageStartupError`` naming the stage and the
  cause (exception class and first line), never engine death;
- admission control: at most ``max_num_queued_reqs`` requests are in flight;
  one more is refused at once with upstream's ``QueueOverflowError`` (503).
  A stage with its own ``max_num_queued_reqs`` (pipeline file) holds at most
  that many: a request handed to it beyond that is refused the same way,
  with that stage's ``stage_id``, and aborted in the stages it went through.
  Nothing waits in a queue it cannot leave, and the wire never drops: the
  ROUTER is ``ROUTER_MANDATORY`` with no high-water mark (the admission limit
  bounds what it holds), so a send either reaches the stage's pipe or fails
  its request with a canonical error.

A stage may run in this process instead (``in_process``, see
``engine.inline``): the guardrail by default, a ``vllm`` stage when its
pipeline asks. Its requests get the same records, deadlines, aborts and
admission; it has no process to exit, so the watch asks it whether it can
still serve (its engine's EngineCore alive) every tick, and its death is the
engine's as a stage process's exit is.

Each local stage process keeps its engine's metrics in a directory of its
own under one directory per engine (``stage_metrics``), which this module
creates, puts on ``/metrics`` and removes when it shuts down.

Stages run as local processes unless a ``StageLauncher`` is given (the Ray
backend, ``ray_backend.py``): it then starts the stages, over ``tcp://``,
and reports their exits (this module only marks the engine dead) and what
its probes see at request time (``LauncherHooks``).

A silent stage - its heartbeats stopped arriving, or its launcher's probe
got no answer - fails the requests in flight at that stage with
``OmniStageTimeoutError`` (504, its ``stage_id``), aborted in every stage,
and every request that needs it (new, or moving on to it) is refused with
``OmniServiceUnavailableError`` (503, its ``stage_id``, retryable) until it
is heard (and its probe answers) again; silent for ``heartbeat_timeout_s``,
it is dead. From the launcher, besides:

- a control plane that does not answer (Ray's GCS) refuses new requests with
  that 503 and the ``stage_id`` of their first stage, while requests already
  admitted go on over the wire, which does not need it.

A faulted stage - its engine runs vLLM's fault tolerance and reported
``diagnosing`` or ``unhealthy`` (with its heartbeat, or asked every tick in
this process; ``fault_tolerance`` reads it) - fails the requests in flight
there with a retryable 503 (its ``stage_id``), and every request that needs
it is refused with the faulted record (503, its ``stage_id``, ``Retry-After``
the rest of its recovery window) until it reports ``healthy``; meanwhile
the orchestrator sends its engine ``retry`` (one recovery at a time, each
with a request id). An engine that reports ``dead`` is the engine's death.

It must not classify exceptions (stages normalize, ``to_exception``
rebuilds) and must not render anything for a transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

import zmq
from vllm.exceptions import QueueOverflowError

from vllm_omni.config import HEARTBEAT_INTERVAL_S, PipelineConfig, StageConfig
from vllm_omni.engine import liveness, processes
from vllm_omni.engine.fault_tolerance import (
    INSTRUCTIONS,
    UNHEALTHY,
    Change,
    StageFault,
    checked_result,
    checked_status,
    recovery_request_id,
)
from vllm_omni.engine.inline import Failure, InlineStage, runs_inline
from vllm_omni.engine.loop_socket import LoopSocket
from vllm_omni.engine.processes import LauncherError, Lease, StageProcess
from vllm_omni.engine.stage_metrics import STAGE_METRICS, StageDirectories
from vllm_omni.engine.stage_worker import WorkerSpec, stage_identity
from vllm_omni.errors import (
    OmniConflictError,
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMNotFoundError,
    VLLMValidationError,
    fatal_reason,
    normalize,
    sanitize_request_id,
    to_exception,
)
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import (
    ABORTS_TOTAL,
    ADMISSION_REJECTIONS_TOTAL,
    ENGINE_DEAD,
    ENGINE_WIDE,
    EVENT_LOOP_LAG,
    REQUESTS_IN_FLIGHT,
    STAGE_FAULTED_SECONDS,
    STAGE_RECOVERIES_TOTAL,
    STAGE_RECOVERY_WINDOW,
    STAGE_STATUS,
    AbortReason,
    StageStatus,
    record_abort,
    set_stage_status,
)
from vllm_omni.errors.normalizer import stage_failure
from vllm_omni.errors.sanitize import sanitize_message
from vllm_omni.errors.text import is_unicode
from vllm_omni.outputs import DiffusionOutput, OmniRequestOutput, TextChoice
from vllm_omni.stages import stage_params
from vllm_omni.tracing.hooks import submission_headers
from vllm_omni.version import __version__
from vllm_omni.wire import hops
from vllm_omni.wire import messages as m

__all__ = [
    "DEFAULT_MAX_NUM_QUEUED_REQS",
    "MODALITIES",
    "LauncherHooks",
    "Orchestrator",
    "StageLauncher",
    "StageStartupError",
]

logger = logging.getLogger(__name__)

Transport = Literal["ipc", "tcp"]
MODALITIES = ("text", "audio", "image", "video")
# Stage kinds that produce each modality, in route order.
_PRODUCERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "text": (("text", "vllm"),),
    "audio": (("talker",), ("vocoder",)),
    "image": (("image",),),
    "video": (("video",),),
}
_TEXT_KINDS = ("text", "vllm")
_WATCH_INTERVAL_S = 0.1
_PARAM_TYPES = (str, int, float, bool, bytes, type(None))
# Requests in flight per engine before admission refuses (upstream's
# ``--max-num-queued-reqs``); big enough for bursts, small enough that the
# queued work drains well inside a typical stage deadline.
DEFAULT_MAX_NUM_QUEUED_REQS = 1024
# How long a recovery may take when its engine did not say (vLLM's default
# engine_recovery_timeout_sec): the engine gives up after it anyway.
_DEFAULT_RECOVERY_WINDOW_S = 120.0


class StageStartupError(OmniServiceUnavailableError):
    """A stage could not start: the engine never ran (503, with ``stage_id``).

    The message names the stage and the cause, for example ``Stage 7 (gpu)
    failed to start: ValidationError: 1 validation error for EngineArgs``.
    """

    def __init__(self, stage: StageConfig, cause: str) -> None:
        super().__init__(f"Stage {stage.id} ({stage.name}) failed to start: {cause}")
        self.stage_id = stage.id
        self.cause = cause
        self.details = normalize(self, stage_id=stage.id)


def _stage_log_settings() -> tuple[int, bool]:
    """The level and traceback choice for stage logs, from this process's
    ``logging`` configuration of ``vllm_omni.stage``: a caller that configured
    nothing (no handler anywhere) gets warnings only, without tracebacks."""
    stage_logger = logging.getLogger("vllm_omni.stage")
    level = stage_logger.getEffectiveLevel()
    if not stage_logger.hasHandlers():
        return max(level, logging.WARNING), False
    return level, True


@dataclasses.dataclass(frozen=True, slots=True)
class LauncherHooks:
    """What a launcher reports to the orchestrator, always on its loop.

    ``exited(stage_id, reason)``: the stage stopped for good (the
    orchestrator decides whether that is a death). ``answering(stage_id,
    ok)``: the stage's liveness probe failed (``False``) or answered again
    (``True``). ``reachable(ok)``: the same for the backend's control plane.
    The probes report changes only; ``reason`` goes to the log, never to a
    client.
    """

    exited: Callable[[int, str], None]
    answering: Callable[[int, bool], None]
    reachable: Callable[[bool], None]


class StageLauncher(Protocol):
    """A worker backend beside local processes: starts stages elsewhere.

    ``prepare`` connects to the backend and returns the host stages reach the
    orchestrator at; ``launch`` starts every stage against ``address`` and
    reports through ``hooks`` until ``stop``, which releases it all.
    """

    def prepare(self) -> str: ...

    async def launch(
        self,
        pipeline: PipelineConfig,
        address: str,
        hooks: LauncherHooks,
    ) -> None: ...

    def stop(self, timeout_s: float) -> None: ...


class _Aborted:
    """Queue marker: the request was aborted through ``abort()``."""


_ABORTED = _Aborted()


class _StageHandle:
    """The orchestrator's view of one stage: its process, identity and health."""

    def __init__(self, config: StageConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.identity = stage_identity(config.id)
        self.process: StageProcess | None = None
        self.ready: asyncio.Future[m.Ready] = loop.create_future()
        self.pid: int | None = None
        self.last_seen = loop.time()
        # Why it is silent: "heartbeat" (not heard from for silence_timeout_s)
        # and/or "probe" (its launcher's probe got no answer). While either
        # holds, requests for it are refused.
        self.silent_by: set[str] = set()
        # Set when the stage runs in this process (``engine.inline``).
        self.inline: InlineStage | None = None
        # Its engine's fault tolerance, as the stage reports it.
        self.fault = StageFault()

    @property
    def silent(self) -> bool:
        return bool(self.silent_by)


@dataclasses.dataclass(slots=True, eq=False)
class _Request:
    """One in-flight request: where it is and where its results go."""

    request_id: str
    # The id on the wire: the caller's id when it is a safe token, else a
    # generated one, so error records (which drop unsafe ids) still route.
    wire_id: str
    queue: asyncio.Queue[m.Output | BaseException | _Aborted]
    stage: StageConfig | None = None
    # The stage whose admission slot the request holds (until that stage
    # finished it, or the request ended).
    slot: StageConfig | None = None
    timer: asyncio.TimerHandle | None = None
    # Set once the request failed, timed out, was cancelled or completed:
    # later messages for it are dropped.
    closed: bool = False


# Integers must fit the wire (msgpack carries 64-bit integers).
_INT_RANGE = range(-(2**63), 2**63)


def _bad_param(value: object, path: str, depth: int = 0) -> str | None:
    """The path of the first value that cannot travel to a stage, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value in _INT_RANGE else path
    if isinstance(value, str):
        # The wire's encoder (UTF-8) raises on a lone surrogate.
        return None if is_unicode(value) else path
    if isinstance(value, _PARAM_TYPES):
        return None
    if depth >= 4:
        return path
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            bad = _bad_param(item, f"{path}[{index}]", depth + 1)
            if bad is not None:
                return bad
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not is_unicode(key):
                return path
            bad = _bad_param(item, f"{path}.{key}" if path else key, depth + 1)
            if bad is not None:
                return bad
        return None
    return path


# Request keys that set the same thing: an entry's one supersedes the others.
_SAME_SETTING = {
    "max_tokens": ("max_completion_tokens",),
    "max_completion_tokens": ("max_tokens",),
}


def _for_stage(
    params: dict[str, Any], entry: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The ``params`` one stage reads: the request's, and over them the
    caller's per-stage entry (``sampling_params_list``), which wins for its
    stage key by key (docs/serving.md, "Per-stage sampling parameters"). A
    whole ``SamplingParams`` entry replaces every sampling key."""
    if not entry:
        return params
    if "sampling_params" in entry:
        params = {key: value for key, value in params.items() if key == "lora"}
    superseded = set(entry).union(*(_SAME_SETTING.get(key, ()) for key in entry))
    kept = {key: value for key, value in params.items() if key not in superseded}
    return {**kept, **entry}


@functools.cache
def _read_by(kinds: tuple[str, ...]) -> frozenset[str]:
    """The ``params`` keys some stage kind of a route reads."""
    return frozenset().union(*(stage_params(kind) for kind in kinds))


def _reap(
    processes: list[StageProcess],
    lease: Lease,
    ipc_dir: str | None,
    metrics: StageDirectories,
) -> None:
    """Last resort (GC, interpreter exit): no stage outlives its engine; the
    launcher closes with its last lease. Also the end of every shutdown: the
    stages' metrics leave ``/metrics`` and their files the disk."""
    for process in processes:
        with contextlib.suppress(Exception):
            if process.is_alive():
                process.kill()
                process.join(1.0)
    lease.release()
    STAGE_METRICS.remove(metrics)
    shutil.rmtree(metrics.root, ignore_errors=True)
    if ipc_dir is not None:
        shutil.rmtree(ipc_dir, ignore_errors=True)


class Orchestrator:
    """Runs a pipeline's stages and moves requests through them."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        *,
        transport: Transport = "ipc",
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout_s: float = 120.0,
        heartbeat_timeout_s: float = 10.0,
        silence_timeout_s: float | None = None,
        death_grace_s: float = 0.1,
        launcher: StageLauncher | None = None,
        max_num_queued_reqs: int = DEFAULT_MAX_NUM_QUEUED_REQS,
    ) -> None:
        if launcher is not None:
            transport = "tcp"  # launched stages may be on other hosts
        if transport not in ("ipc", "tcp"):
            raise VLLMValidationError(
                "transport must be 'ipc' or 'tcp'", parameter="transport"
            )
        if (
            isinstance(max_num_queued_reqs, bool)
            or not isinstance(max_num_queued_reqs, int)
            or max_num_queued_reqs < 1
        ):
            raise VLLMValidationError(
                "max_num_queued_reqs must be a positive integer",
                parameter="max_num_queued_reqs",
            )
        self.max_num_queued_reqs = max_num_queued_reqs
        self.pipeline = pipeline
        self._transport = transport
        self._host = host
        self._port = port
        self._startup_timeout_s = startup_timeout_s
        self._heartbeat_timeout_s = heartbeat_timeout_s
        # None: a stage is never silent, only dead after heartbeat_timeout_s.
        self._silence_timeout_s = silence_timeout_s
        self._death_grace_s = death_grace_s
        self._launcher = launcher
        self.address = ""
        self._ipc_dir: str | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socket: LoopSocket | None = None
        self._handles: dict[int, _StageHandle] = {}
        self._by_identity: dict[bytes, _StageHandle] = {}
        self._requests: dict[str, _Request] = {}
        # Requests each stage holds, for the stages' own admission limits.
        self._stage_load = {stage.id: 0 for stage in pipeline.stages}
        for stage in pipeline.stages:
            if stage.max_num_queued_reqs is not None:
                ADMISSION_REJECTIONS_TOTAL.labels("max_num_queued_reqs", str(stage.id))
        self._by_wire: dict[str, _Request] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        # Recoveries in flight (at most one per stage).
        self._recoveries: set[asyncio.Task[None]] = set()
        self._dead: OmniEngineDeadError | None = None
        # The launcher's control plane does not answer: admission refuses.
        self._unreachable = False
        self._started = False
        self._closed = False
        self._finalizer: weakref.finalize | None = None
        self.modalities = frozenset(
            modality
            for modality, chain in _PRODUCERS.items()
            if all(self._first_of(kinds) is not None for kinds in chain)
        )

    # -- state -----------------------------------------------------------------

    @property
    def dead_error(self) -> OmniEngineDeadError | None:
        """The error that killed the engine, or ``None`` while it is healthy."""
        return self._dead

    @property
    def is_running(self) -> bool:
        return self._started and not self._closed and self._dead is None

    def stage_pids(self) -> dict[int, int | None]:
        return {sid: handle.pid for sid, handle in self._handles.items()}

    def stage_for(self, modality: str) -> StageConfig | None:
        """The first stage producing ``modality`` (its first producer kind)."""
        chain = _PRODUCERS.get(modality)
        return self._first_of(chain[0]) if chain else None

    def _first_of(self, kinds: tuple[str, ...]) -> StageConfig | None:
        return next((s for s in self.pipeline.stages if s.kind in kinds), None)

    # -- startup and shutdown -------------------------------------------------

    async def start(self) -> None:
        """Bind, start the local stages, and wait until every stage is ready."""
        if self._started or self._closed:
            raise RuntimeError("an orchestrator starts once")
        loop = asyncio.get_running_loop()
        self._context = zmq.Context()
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        # A ROUTER silently drops what it cannot queue: with MANDATORY an
        # unroutable send fails instead, and without a high-water mark a busy
        # stage's pipe grows (bounded by admission) instead of dropping.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 0)
        router.setsockopt(zmq.RCVHWM, 0)
        self._socket = LoopSocket(router, self._on_frames)
        for stage in self.pipeline.stages:
            handle = _StageHandle(stage, loop)
            self._handles[stage.id] = handle
            self._by_identity[handle.identity] = handle
        try:
            if self._launcher is not None:
                self._host = await asyncio.to_thread(self._launcher.prepare)
            self.address = self._bind(router)
            self._socket.start(loop)
            if self._launcher is None:
                await asyncio.to_thread(self._spawn_local)
            else:
                await self._launcher.launch(
                    self.pipeline,
                    self.address,
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
            for handle in self._handles.values():
                if handle.config.remote:
                    logger.warning(
                        "waiting for remote stage %d: python -m "
                        "vllm_omni.engine.stage_worker --connect %s --pipeline %s "
                        "--stage-id %d",
                        handle.config.id,
                        self.address,
                        self.pipeline.source,
                        handle.config.id,
                    )
            async with asyncio.timeout(self._startup_timeout_s):
                await asyncio.gather(*(h.ready for h in self._handles.values()))
        except TimeoutError:
            # The timeout cancelled the ready futures it waited for: a stage
            # that was ready has a result.
            waiting = [
                h.config
                for h in self._handles.values()
                if h.ready.cancelled() or not h.ready.done()
            ]
            self.shutdown()
            cause = f"not ready within {self._startup_timeout_s:g} s"
            if waiting[0].remote:
                cause += " (no remote worker connected)"
            if len(waiting) > 1:
                others = ", ".join(str(stage.id) for stage in waiting[1:])
                cause += f"; stages {others} were not ready either"
            raise StageStartupError(waiting[0], cause) from None
        except BaseException:
            self.shutdown()
            raise
        self._started = True
        ENGINE_DEAD.set(0)
        for handle in self._handles.values():
            self._publish(handle)

    def _bind(self, socket: zmq.Socket[bytes]) -> str:
        if self._transport == "tcp":
            socket.bind(f"tcp://{self._host}:{self._port or '*'}")
            return socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._ipc_dir = tempfile.mkdtemp(prefix="vllm-omni-")
        address = f"ipc://{self._ipc_dir}/stages.sock"
        socket.bind(address)
        return address

    async def _start_inline(self) -> None:
        """Build and start the stages that run in this process (``inline``);
        one that cannot start is that stage's startup error, as from a stage
        process."""
        local = self._launcher is None
        level, tracebacks = _stage_log_settings()
        for handle in self._handles.values():
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
            self, _reap, started, lease, self._ipc_dir, metrics
        )
        STAGE_METRICS.add(metrics)
        level, tracebacks = _stage_log_settings()
        for handle in self._handles.values():
            if handle.config.remote or runs_inline(handle.config, self.pipeline, True):
                continue
            spec = WorkerSpec(
                stage=handle.config,
                pipeline=self.pipeline,
                address=self.address,
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
        if self._closed:
            return
        self._closed = True
        for handle in self._handles.values():
            self._post(handle, m.Shutdown())
        self._close_requests(
            lambda req: OmniServiceUnavailableError("The engine is shutting down.")
        )
        for task in [*self._tasks, *self._recoveries]:
            # A dropped engine may be finalized after its loop closed.
            with contextlib.suppress(RuntimeError):
                task.cancel()
        if self._started:
            self._unpublish()
        for handle in self._handles.values():
            if handle.ready.done() and not handle.ready.cancelled():
                handle.ready.exception()  # retrieved: a failed start already raised
        for handle in self._handles.values():
            if handle.inline is not None:
                handle.inline.close()
                STAGE_METRICS.remove(handle.inline)
        deadline = time.monotonic() + timeout_s
        for handle in self._handles.values():
            if handle.process is not None:
                handle.process.join(max(0.0, deadline - time.monotonic()))
                if handle.process.is_alive():
                    handle.process.terminate()
                    handle.process.join(1.0)
        if self._launcher is not None:
            self._launcher.stop(max(0.0, deadline - time.monotonic()))
        if self._socket is not None:
            self._socket.close()
        if self._context is not None:
            self._context.term()
        if self._finalizer is not None:
            self._finalizer()
        elif self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

    # -- the wire --------------------------------------------------------------

    def _post(
        self,
        handle: _StageHandle,
        message: m.Message,
        request: _Request | None = None,
    ) -> None:
        """Send without waiting (no high-water mark: it never blocks). A send
        that fails (the stage is not connected) fails ``request``, if given.
        A stage in this process hears its aborts directly (``_run`` runs its
        requests; it has nothing to shut down or beat for)."""
        if handle.inline is not None:
            if isinstance(message, m.Abort):
                handle.inline.abort(message.request_id)
            return
        if self._socket is None or self._socket.closed:
            if request is not None:
                self._fail_send(request, handle)
            return
        try:
            self._socket.send_multipart([handle.identity, m.encode(message)])
        except zmq.ZMQError as exc:
            logger.log(
                logging.DEBUG if request is None else logging.WARNING,
                "send to stage %d failed: %s",
                handle.config.id,
                exc,
            )
            if request is not None:
                self._fail_send(request, handle)

    def _fail_send(self, request: _Request, handle: _StageHandle) -> None:
        if request.closed:
            return
        self._close(
            request,
            OmniServiceUnavailableError(
                f"Stage {handle.config.id} ({handle.config.name}) is not reachable."
            ),
        )
        self._abort_everywhere(request, None)

    def _on_frames(self, frames: list[bytes]) -> None:
        """One message off the wire (``LoopSocket`` calls it as it is read)."""
        if len(frames) != 2:
            return
        handle = self._by_identity.get(frames[0])
        message = m.decode(frames[1])
        if handle is None or message is None:
            logger.debug("dropped a message from %r", frames[0])
            return
        handle.last_seen = handle.ready.get_loop().time()
        self._dispatch(handle, message)

    def _dispatch(self, handle: _StageHandle, message: m.Message) -> None:
        if isinstance(message, m.Output):
            hops.mark(message.request_id, "orchestrator.received", handle.config.id)
            request = self._by_wire.get(message.request_id)
            if (
                request is not None
                and not request.closed
                and request.stage is not None
                and request.stage.id == handle.config.id
            ):
                if message.finished:
                    # The stage met its deadline, however slowly this is read.
                    self._cancel_timer(request)
                request.queue.put_nowait(message)
        elif isinstance(message, m.ErrorMessage):
            hops.mark(message.request_id or "", "orchestrator.error", handle.config.id)
            self._on_error(handle, message.to_details(), message.reason)
        elif isinstance(message, m.Ready):
            handle.pid = message.pid
            if message.wire >= m.WIRE_VERSION:
                # The stage may now drop the 0.30 duplicate fields.
                self._post(handle, m.Welcome(wire=m.WIRE_VERSION))
            if not handle.ready.done():
                handle.ready.set_result(message)
            logger.info(
                "stage %d (%s) ready, pid %d",
                message.stage_id,
                message.kind,
                message.pid,
            )
        elif isinstance(message, m.UtilityResponse):
            future = self._calls.pop(message.call_id, None)
            if future is not None and not future.done():
                future.set_result(message.result)
        elif isinstance(message, m.Heartbeat):
            self._on_engine_status(
                handle, message.engine_status, message.recovery_window_s
            )

    def _on_error(
        self, handle: _StageHandle, details: OmniErrorDetails, reason: str | None
    ) -> None:
        if details.request_id is None and not handle.ready.done():
            # The stage's startup record: the cause, before its process exits.
            self._fail_start(handle.config, details.message)
            return
        if details.fatal:
            self._mark_dead(
                handle.config.id, reason or "the stage reported a fatal error"
            )
            return
        request = self._by_wire.get(details.request_id or "")
        if request is None or request.closed:
            logger.warning(
                "stage %d error for no live request: %s", handle.config.id, details
            )
            return
        self._close(request, stage_failure(details))

    # -- liveness --------------------------------------------------------------

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = previous = loop.time()
        while self._dead is None and not self._closed:
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
                for handle in self._handles.values():
                    handle.last_seen = liveness.credited(handle.last_seen, paused, now)
            for handle in self._handles.values():
                death = handle.inline.health() if handle.inline is not None else None
                if death is not None:
                    # In this process: its engine died (no process to exit).
                    self._mark_dead(handle.config.id, fatal_reason(death))
                    return
                if handle.inline is not None:
                    self._on_engine_status(handle, *handle.inline.fault_status())
                    if self._dead is not None:
                        return
                self._watch_fault(handle, now)
                process = handle.process
                if process is not None and not process.is_alive():
                    # Let the receiver deliver a fatal record sent just before exit.
                    await asyncio.sleep(self._death_grace_s)
                    self._mark_dead(
                        handle.config.id,
                        f"stage process exited with code {process.exitcode}",
                    )
                    return
                if self._watched_by_heartbeat(handle) and handle.ready.done():
                    unheard = now - handle.last_seen
                    if unheard > self._heartbeat_timeout_s:
                        self._mark_dead(handle.config.id, "stage heartbeat lost")
                        return
                    if self._silence_timeout_s is not None:
                        self._set_silent(
                            handle,
                            "heartbeat",
                            unheard > self._silence_timeout_s,
                            f"not heard from for {unheard:.1f} s",
                        )
            if now >= next_beat:
                next_beat = now + HEARTBEAT_INTERVAL_S
                for handle in self._handles.values():
                    if self._watched_by_heartbeat(handle):
                        self._post(handle, m.Heartbeat())

    def _watched_by_heartbeat(self, handle: _StageHandle) -> bool:
        return handle.config.remote or self._launcher is not None

    def _on_stage_exit(self, stage_id: int, reason: str) -> None:
        """A launched stage stopped (the launcher's liveness source)."""

        async def mark() -> None:
            # Let the receiver deliver a fatal record sent just before exit.
            await asyncio.sleep(self._death_grace_s)
            self._mark_dead(stage_id, reason)

        self._tasks.append(asyncio.create_task(mark(), name=f"omni-exit-{stage_id}"))

    def _on_stage_answering(self, stage_id: int, answering: bool) -> None:
        """A launched stage's probe changed: see the module docstring."""
        self._set_silent(
            self._handles[stage_id], "probe", not answering, "its probe got no answer"
        )

    def _set_silent(
        self, handle: _StageHandle, source: str, silent: bool, why: str
    ) -> None:
        """``source`` says the stage is silent (or no longer); on the change of
        the stage's state, fail what it holds, or admit again."""
        was = handle.silent
        if silent:
            handle.silent_by.add(source)
        else:
            handle.silent_by.discard(source)
        if handle.silent == was or self._closed or self._dead is not None:
            return
        self._publish(handle)
        stage_id, name = handle.config.id, handle.config.name
        if not silent:
            logger.info("stage %d (%s) answers again: admitting", stage_id, name)
            return
        stuck = [
            r
            for r in self._requests.values()
            if not r.closed and r.stage is not None and r.stage.id == stage_id
        ]
        logger.warning(
            "stage %d (%s) does not answer (%s): %d request(s) in flight there "
            "fail with 504, new ones for it are refused with 503",
            stage_id,
            name,
            why,
            len(stuck),
        )
        for request in stuck:
            self._close(
                request,
                OmniStageTimeoutError(
                    f"Stage {stage_id} ({name}) stopped answering.", stage_id=stage_id
                ),
            )
            self._abort_everywhere(request, "timeout")

    def _on_reachable(self, reachable: bool) -> None:
        """The launcher's control plane changed: see the module docstring."""
        if self._unreachable is not reachable:
            return
        self._unreachable = not reachable
        if reachable:
            logger.info("the stages' cluster answers again: admitting")
        else:
            logger.warning(
                "the stages' cluster does not answer: new requests are refused "
                "with 503, admitted ones go on"
            )

    def _check_answering(self, stage: StageConfig, request_id: str | None) -> None:
        """Refuse a request that needs ``stage`` while the stage is silent
        (503) or its engine faulted (``_refuse_faulted``)."""
        handle = self._handles[stage.id]
        if handle.silent:
            raise OmniServiceUnavailableError(
                f"Stage {stage.id} ({stage.name}) is not answering; retry later.",
                stage_id=stage.id,
            )
        if handle.fault.faulted:
            self._refuse_faulted(handle, request_id)

    def _refuse_faulted(self, handle: _StageHandle, request_id: str | None) -> None:
        """Raise the faulted record of ``handle``'s stage: a retryable 503
        naming it, ``Retry-After`` the rest of its recovery window (vLLM
        0.34's ``EngineFaultedError`` where it is defined)."""
        stage = handle.config
        details = OmniErrorDetails(
            sanitize_message(
                f"Stage {stage.id} ({stage.name}) has faulted and cannot accept "
                "new requests. Please try again later or on a different instance."
            ),
            "server",
            503,
            "ServiceUnavailableError",
            request_id=sanitize_request_id(request_id),
            stage_id=stage.id,
            faulted=True,
            retry_after_s=handle.fault.retry_after_s(handle.ready.get_loop().time()),
        )
        raise to_exception(details)

    def check_faulted(self) -> None:
        """Raise the faulted record of the first stage whose engine is
        faulted (``/health``); return while none is."""
        for handle in self._handles.values():
            if handle.fault.faulted:
                self._refuse_faulted(handle, None)

    # -- fault tolerance -------------------------------------------------------

    def _on_engine_status(
        self, handle: _StageHandle, raw: object, window_s: object
    ) -> None:
        """A stage reported its engine's fault-tolerance status (with its
        heartbeat, or asked in this process): act on the change it makes."""
        status = checked_status(raw)
        if status is None and handle.fault.status is None:
            return  # no fault tolerance: the usual heartbeat
        window = float(window_s) if isinstance(window_s, int | float) else None
        loop = handle.ready.get_loop()
        now = loop.time()
        change = handle.fault.report(status, window, now)
        if handle.fault.window_s is not None:
            STAGE_RECOVERY_WINDOW.labels(str(handle.config.id)).set(
                handle.fault.window_s
            )
        if change is not None:
            self._on_fault_change(handle, change)
        if self._dead is None and not self._closed:
            self._publish(handle)
            self._watch_fault(handle, now)

    def _on_fault_change(self, handle: _StageHandle, change: Change) -> None:
        """The stage's engine faulted (fail what it holds, refuse what needs
        it), recovered (admit again) or gave up (the engine is dead)."""
        stage_id, name = handle.config.id, handle.config.name
        if self._closed or self._dead is not None:
            return
        if change == "dead":
            self._mark_dead(
                stage_id, "its engine faulted and did not recover (status dead)"
            )
            return
        if change == "recovered":
            STAGE_FAULTED_SECONDS.labels(str(stage_id)).set(0)
            logger.info(
                "stage %d (%s) recovered from its fault: admitting", stage_id, name
            )
            return
        stuck = [
            r
            for r in self._requests.values()
            if not r.closed and r.stage is not None and r.stage.id == stage_id
        ]
        status = handle.fault.status or {}
        logger.warning(
            "stage %d (%s) faulted (engine %s, %s): %d request(s) in flight there "
            "fail with 503, new ones for it are refused with 503 until it recovers "
            "(recovery window %s)",
            stage_id,
            name,
            status.get("status"),
            status.get("fault_info", "no fault info"),
            len(stuck),
            "unknown"
            if handle.fault.window_s is None
            else f"{handle.fault.window_s:g} s",
        )
        for request in stuck:
            self._close(
                request,
                OmniServiceUnavailableError(
                    f"Stage {stage_id} ({name}) faulted before the request "
                    "finished. Please try again later or on a different instance.",
                    stage_id=stage_id,
                ),
            )
            # Not an abort anyone asked for: uncounted.
            self._abort_everywhere(request, None)

    def _watch_fault(self, handle: _StageHandle, now: float) -> None:
        """Each watch tick and status report: how long the stage has been
        faulted, and the recovery the server drives (``retry``, one at a
        time, the next after a backoff when one failed)."""
        if not handle.fault.faulted:
            return
        STAGE_FAULTED_SECONDS.labels(str(handle.config.id)).set(
            handle.fault.faulted_for(now)
        )
        if handle.fault.wants_recovery(now):
            self._start_recovery(handle, "retry", {}, recovery_request_id())

    def apply_fault_instruction(
        self,
        stage_id: int,
        instruction: str,
        params: Mapping[str, Any],
        request_id: str,
    ) -> None:
        """Start a fault-tolerance instruction at a stage's engine (vLLM
        0.34's ``/v1/fault_tolerance/apply``); its result shows in
        ``fault_tolerance_status``. Raises when it cannot start: an unknown
        instruction (400), a stage without fault tolerance (404), a
        stage that is not waiting for one or is recovering already (409)."""
        self._check_serving()
        if instruction not in INSTRUCTIONS:
            raise VLLMValidationError(
                f"instruction must be one of {', '.join(sorted(INSTRUCTIONS))}",
                parameter="instruction",
            )
        handle = self._handles.get(stage_id)
        if handle is None or handle.fault.status is None:
            tolerant = ", ".join(map(str, self.fault_tolerant_stages())) or "none"
            raise VLLMNotFoundError(
                f"Stage {stage_id} has no engine that runs fault tolerance "
                f"(stages that have one: {tolerant})."
            )
        name = handle.config.name
        if handle.fault.recovering is not None:
            raise OmniConflictError(
                f"Stage {stage_id} ({name}) is recovering already; one recovery "
                "at a time."
            )
        if handle.fault.state != UNHEALTHY:
            raise OmniConflictError(
                f"Stage {stage_id} ({name}) is {handle.fault.state}: its engine "
                "takes an instruction only while it is unhealthy."
            )
        self._start_recovery(handle, instruction, dict(params), request_id)

    def _start_recovery(
        self,
        handle: _StageHandle,
        instruction: str,
        params: dict[str, Any],
        request_id: str,
    ) -> None:
        handle.fault.begin(request_id)
        logger.info(
            "stage %d (%s): recovery %s started (%s)",
            handle.config.id,
            handle.config.name,
            request_id,
            instruction,
        )
        task = asyncio.create_task(
            self._recover(handle, instruction, params, request_id),
            name=f"omni-recovery-{handle.config.id}",
        )
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)

    async def _recover(
        self,
        handle: _StageHandle,
        instruction: str,
        params: dict[str, Any],
        request_id: str,
    ) -> None:
        """Send the instruction through the stage's engine (its own
        ``handle_fault``) and wait for its answer, at most its window."""
        window = handle.fault.window_s or _DEFAULT_RECOVERY_WINDOW_S
        raw: object = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(window):
                if handle.inline is not None:
                    raw = await handle.inline.handle_fault(
                        instruction, params, request_id
                    )
                else:
                    raw = await self._call_stage(
                        handle,
                        "handle_fault",
                        {
                            "instruction": instruction,
                            "params": params,
                            "request_id": request_id,
                        },
                    )
        result = checked_result(raw, request_id)
        handle.fault.end(result, handle.ready.get_loop().time())
        outcome = "succeeded" if result["success"] else "failed"
        STAGE_RECOVERIES_TOTAL.labels(str(handle.config.id), outcome).inc()
        logger.log(
            logging.INFO if result["success"] else logging.WARNING,
            "stage %d (%s): recovery %s %s%s",
            handle.config.id,
            handle.config.name,
            request_id,
            outcome,
            f": {result['reason']}" if result["reason"] else "",
        )

    async def _call_stage(
        self, handle: _StageHandle, method: str, args: dict[str, Any]
    ) -> Any:
        """One utility call to one stage process; its result (``None`` when
        the engine died meanwhile)."""
        call_id = next(self._call_ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self._post(
                handle, m.UtilityRequest(call_id=call_id, method=method, args=args)
            )
            return await future
        finally:
            self._calls.pop(call_id, None)

    def fault_tolerant_stages(self) -> list[int]:
        """The stages whose engine reported a fault-tolerance status."""
        return [sid for sid, h in self._handles.items() if h.fault.status is not None]

    def faulted_stages(self) -> list[StageConfig]:
        """The stages whose engine is faulted now (diagnosing or unhealthy)."""
        return [h.config for h in self._handles.values() if h.fault.faulted]

    def fault_tolerance_status(self) -> list[dict[str, Any]]:
        """Each stage's status as ``/v1/fault_tolerance/status`` shows it:
        the server's view (``status``), and for a stage whose engine runs
        fault tolerance its engine's own entry (vLLM 0.34's shape), window,
        current fault's length and recoveries."""
        now = asyncio.get_running_loop().time()
        stages = []
        for sid, handle in self._handles.items():
            fault = handle.fault
            entry: dict[str, Any] = {
                "stage_id": sid,
                "name": handle.config.name,
                "status": self._status_of(handle),
                "fault_tolerance": fault.status is not None,
            }
            if fault.status is not None:
                entry.update(
                    engines=[dict(fault.status)],
                    recovery_window_s=fault.window_s,
                    faulted_s=round(fault.faulted_for(now), 3),
                    recovering=fault.recovering,
                    last_recovery=fault.last_result,
                )
            stages.append(entry)
        return stages

    def _status_of(self, handle: _StageHandle) -> StageStatus:
        if self._dead is not None and self._dead.stage_id == handle.config.id:
            return "dead"
        if handle.silent:
            return "silent"
        state = handle.fault.state
        return state if handle.fault.faulted else "healthy"  # type: ignore[return-value]

    def _publish(self, handle: _StageHandle) -> None:
        """The stage's status on ``/metrics`` (``vllm_omni:stage_status``)."""
        set_stage_status(str(handle.config.id), self._status_of(handle))

    def _unpublish(self) -> None:
        """This engine's stages leave ``/metrics`` when it shuts down."""
        for stage_id in self._handles:
            labels = str(stage_id)
            for metric in (STAGE_FAULTED_SECONDS, STAGE_RECOVERY_WINDOW):
                with contextlib.suppress(KeyError):
                    metric.remove(labels)
            for status in ("healthy", "silent", "diagnosing", "unhealthy", "dead"):
                with contextlib.suppress(KeyError):
                    STAGE_STATUS.remove(labels, status)

    def _dead_error_for(self, request_id: str | None) -> OmniEngineDeadError:
        """A fresh dead error for one request (each raise gets its own)."""
        assert self._dead is not None
        return OmniEngineDeadError(
            stage_id=self._dead.stage_id,
            reason=self._dead.reason,
            details=normalize(self._dead, request_id=request_id),
        )

    def _fail_start(self, stage: StageConfig, cause: str) -> None:
        """A stage failed before the engine ran: ``start`` raises the first
        such error (every waiting stage gets it, so nothing is left pending)."""
        waiting = [h for h in self._handles.values() if not h.ready.done()]
        if not waiting:
            return
        logger.error("stage %d (%s) failed to start: %s", stage.id, stage.name, cause)
        error = StageStartupError(stage, cause)
        for handle in waiting:
            handle.ready.set_exception(error)

    def _mark_dead(self, stage_id: int, reason: str) -> None:
        if self._dead is not None or self._closed:
            return
        if not self._started:
            self._fail_start(self._handles[stage_id].config, reason)
            return
        dead = OmniEngineDeadError(stage_id=stage_id, reason=reason)
        dead.details = normalize(dead)
        self._dead = dead
        ENGINE_DEAD.set(1)
        if stage_id in self._handles:
            self._publish(self._handles[stage_id])
        # The one log line of this death; requests refused later log at INFO.
        logger.critical(
            "engine dead: stage %d (%s) failed fatally: %s",
            stage_id,
            self._handles[stage_id].config.name
            if stage_id in self._handles
            else "unknown",
            reason,
        )
        # Every in-flight request, the one that triggered a fatal record
        # included, gets the same error with the reason and its own id.
        self._close_requests(lambda request: self._dead_error_for(request.wire_id))
        for handle in self._handles.values():
            if handle.inline is not None:
                handle.inline.cancel_all()  # as a dead stage process stops
            if not handle.ready.done():
                handle.ready.set_exception(self._dead_error_for(None))
        for future in self._calls.values():
            if not future.done():
                future.set_result(None)

    # -- requests --------------------------------------------------------------

    def route(self, modalities: Iterable[str]) -> tuple[StageConfig, ...]:
        """The stages a request for ``modalities`` goes through, in order.

        Raises before anything is sent: ``VLLMValidationError`` (modalities)
        for an unknown modality or combination, ``OmniServiceUnavailableError``
        (503) when this pipeline has no stage for a requested modality.
        """
        wanted = set(modalities)
        unknown = wanted - set(MODALITIES)
        if unknown or not wanted:
            raise VLLMValidationError(
                f"modalities must be a non-empty subset of {', '.join(MODALITIES)}",
                parameter="modalities",
            )
        for modality in MODALITIES:
            if modality in wanted and modality not in self.modalities:
                raise OmniServiceUnavailableError(f"pipeline has no {modality} stage")
        if len(wanted) > 1 and wanted & {"image", "video"}:
            raise VLLMValidationError(
                "image and video requests cannot be combined with other modalities",
                parameter="modalities",
            )
        route = [s for s in self.pipeline.stages if s.kind == "guardrail"]
        for modality in MODALITIES:
            if modality in wanted:
                for kinds in _PRODUCERS[modality]:
                    stage = self._first_of(kinds)
                    assert stage is not None
                    route.append(stage)
        return tuple(route)

    def _check_serving(self, request_id: str | None = None) -> None:
        if self._dead is not None:
            raise self._dead_error_for(request_id)
        if not self._started or self._closed:
            raise OmniServiceUnavailableError("The engine is not running.")

    async def generate(
        self,
        prompt: str,
        *,
        request_id: str,
        modalities: Iterable[str],
        params: Mapping[str, Any],
        stage_params: Mapping[int, Mapping[str, Any]] | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        """Run one request along its route; see ``AsyncOmni.generate``.
        ``stage_params`` (stage id → the caller's checked entry) combine with
        ``params`` for their stage (``_for_stage``). Each submission carries
        the request's trace headers (``tracing.hooks.submission_headers``)."""
        hops.mark(request_id, "orchestrator.generate")
        self._check_serving(request_id)
        wanted = frozenset(modalities)
        route = self.route(wanted)
        if not isinstance(prompt, str):
            raise VLLMValidationError("prompt must be a string", parameter="prompt")
        if not is_unicode(prompt):
            raise VLLMValidationError(
                "prompt is not valid Unicode (it holds a lone surrogate)",
                parameter="prompt",
            )
        bad = "params" if not isinstance(params, Mapping) else _bad_param(params, "")
        for stage_id, entry in (stage_params or {}).items():
            bad = bad or _bad_param(entry, f"sampling_params_list[{stage_id}]")
        if bad is not None:
            raise VLLMValidationError(
                f"{bad or 'params'} must be a plain value: a string, a 64-bit "
                "integer, a number, a bool, bytes, or lists and mappings of them",
                parameter=bad or "params",
            )
        readable = _read_by(tuple(stage.kind for stage in route))
        unread = next((key for key in params if key not in readable), None)
        if unread is not None:
            raise VLLMValidationError(
                f"{unread} is not a parameter of any stage this request goes "
                f"through ({', '.join(f'{s.id} ({s.name})' for s in route)})",
                parameter=str(unread),
            )
        if request_id in self._requests:
            raise OmniConflictError("A request with this id is already in flight.")
        if self._unreachable:
            first = route[0]
            raise OmniServiceUnavailableError(
                f"Stage {first.id} ({first.name}) cannot be reached; retry later.",
                stage_id=first.id,
            )
        for stage in route:
            self._check_answering(stage, request_id)
        if len(self._requests) >= self.max_num_queued_reqs:
            ADMISSION_REJECTIONS_TOTAL.labels("max_num_queued_reqs", ENGINE_WIDE).inc()
            logger.debug(
                "request %s refused: %d requests in flight (max %d)",
                request_id,
                len(self._requests),
                self.max_num_queued_reqs,
            )
            raise QueueOverflowError()
        safe = sanitize_request_id(request_id) == request_id
        wire_id = request_id if safe else f"omni-{uuid.uuid4().hex}"
        request = _Request(request_id, wire_id, asyncio.Queue())
        self._requests[request_id] = request
        self._by_wire[wire_id] = request
        REQUESTS_IN_FLIGHT.inc()
        try:
            # aclosing: a consumer that goes away closes the whole chain now,
            # not when the garbage collector gets to it.
            async with contextlib.aclosing(
                self._run(
                    request,
                    route,
                    prompt,
                    dict(params),
                    dict(stage_params or {}),
                    wanted,
                    submission_headers(trace_headers),
                )
            ) as outputs:
                async for output in outputs:
                    yield output
        except (asyncio.CancelledError, GeneratorExit, KeyboardInterrupt):
            if not request.closed:
                request.closed = True
                # The transport's reason (client_disconnect) when it gave one.
                record_abort("cancelled")
                self._abort_everywhere(request, None)
            raise
        finally:
            request.closed = True
            self._cancel_timer(request)
            self._release(request)
            self._requests.pop(request_id, None)
            self._by_wire.pop(wire_id, None)
            REQUESTS_IN_FLIGHT.dec()

    async def _run(
        self,
        request: _Request,
        route: tuple[StageConfig, ...],
        prompt: str,
        params: dict[str, Any],
        stage_params: dict[int, Mapping[str, Any]],
        wanted: frozenset[str],
        trace: dict[str, str] | None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        final = OmniRequestOutput(request_id=request.request_id)
        inputs: m.Payload | None = None
        for stage in route:
            submit = m.Submit(
                request_id=request.wire_id,
                prompt=prompt,
                params=_for_stage(params, stage_params.get(stage.id)),
                inputs=inputs,
                trace=trace,
            )
            self._submit(request, stage, submit)
            inline = self._handles[stage.id].inline
            if inline is not None:
                if inline.waits:
                    self._spawn_inline(request, stage, inline, submit)
                else:
                    await self._run_inline(request, stage, inline, submit)
            result = m.Payload()
            while True:
                item = await request.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Aborted):
                    final.finished = True
                    final.finish_reason = "abort"
                    final.stage_id = stage.id
                    yield final
                    return
                payload = item.payload
                _accumulate(result, payload)
                if payload.meta:
                    final.meta.setdefault(stage.name, {}).update(payload.meta)
                if "text" in wanted and stage.kind in _TEXT_KINDS:
                    choice = _choice(final, payload)
                    if payload.text or payload.finish_reason or payload.logprobs:
                        hops.mark(request.wire_id, "orchestrator.yield", stage.id)
                        yield OmniRequestOutput(
                            request_id=request.request_id,
                            text=choice.text,
                            text_delta=payload.text,
                            index=payload.index,
                            logprobs=payload.logprobs,
                            finish_reason=payload.finish_reason,
                            stage_id=stage.id,
                        )
                if item.finished:
                    break
            self._cancel_timer(request)
            self._release(request)
            _finish_stage(final, stage, result)
            inputs = result
        request.closed = True
        final.finished = True
        final.stage_id = route[-1].id
        final.finish_reason = final.finish_reason or "stop"
        yield final

    def _submit(self, request: _Request, stage: StageConfig, submit: m.Submit) -> None:
        self._check_serving(request.wire_id)
        try:
            self._check_answering(stage, request.request_id)
            self._admit(request, stage)
        except Exception:
            if request.stage is not None:
                # Refused mid-route (a full or silent stage): nothing may stay
                # behind in the stages it went through. Not an abort anyone
                # asked for: uncounted.
                request.closed = True
                self._abort_everywhere(request, None)
            raise
        request.stage = stage
        if stage.timeout_s is not None:
            loop = asyncio.get_running_loop()
            request.timer = loop.call_later(
                stage.timeout_s, self._on_deadline, request, stage
            )
        hops.mark(request.wire_id, "orchestrator.submit", stage.id)
        handle = self._handles[stage.id]
        if handle.inline is None:
            self._post(handle, submit, request)

    async def _run_inline(
        self,
        request: _Request,
        stage: StageConfig,
        inline: InlineStage,
        submit: m.Submit,
    ) -> None:
        """Run the request through a stage in this process; what comes out
        is queued for ``_run`` as a stage process's messages would be."""
        payloads, failure = await inline.run(submit)
        for payload in payloads:
            self._emit(request, stage, payload)
        self._inline_done(request, stage, failure)

    def _spawn_inline(
        self,
        request: _Request,
        stage: StageConfig,
        inline: InlineStage,
        submit: m.Submit,
    ) -> None:
        """Run the request through a stage in this process that waits, in a
        task of its own (aborts cancel it): each chunk is queued for ``_run``
        as it comes, as a stage process's messages would be."""
        inline.spawn(
            submit,
            functools.partial(self._emit, request, stage),
            functools.partial(self._inline_done, request, stage),
        )

    @staticmethod
    def _emit(request: _Request, stage: StageConfig, payload: m.Payload) -> None:
        if not request.closed and request.stage is stage:
            hops.mark(request.wire_id, "orchestrator.received", stage.id)
            request.queue.put_nowait(
                m.Output(request_id=request.wire_id, stage_id=stage.id, payload=payload)
            )

    def _inline_done(
        self, request: _Request, stage: StageConfig, failure: Failure | None
    ) -> None:
        """A stage in this process finished the request (``failure`` is
        ``None``) or failed it: what a stage process's last message does."""
        if request.closed or request.stage is not stage:
            return  # failed, aborted or timed out meanwhile: already queued
        if failure is not None:
            details, exc = failure
            if details.fatal:
                self._mark_dead(
                    stage.id, fatal_reason(exc) or "the stage reported a fatal error"
                )
            else:
                self._close(request, stage_failure(details))
            return
        self._cancel_timer(request)
        request.queue.put_nowait(
            m.Output(request_id=request.wire_id, stage_id=stage.id, finished=True)
        )

    def _admit(self, request: _Request, stage: StageConfig) -> None:
        """Take a slot in ``stage``, or refuse the request: the stage holds its
        ``max_num_queued_reqs`` already (``QueueOverflowError`` with its id)."""
        limit = stage.max_num_queued_reqs
        if limit is not None and self._stage_load[stage.id] >= limit:
            ADMISSION_REJECTIONS_TOTAL.labels(
                "max_num_queued_reqs", str(stage.id)
            ).inc()
            logger.debug(
                "request %s refused: stage %d holds %d requests (max %d)",
                request.request_id,
                stage.id,
                self._stage_load[stage.id],
                limit,
            )
            error = QueueOverflowError()
            error.stage_id = stage.id  # type: ignore[attr-defined]
            raise error
        self._stage_load[stage.id] += 1
        request.slot = stage

    def _release(self, request: _Request) -> None:
        """Give back the request's stage slot, once."""
        if request.slot is not None:
            self._stage_load[request.slot.id] -= 1
            request.slot = None

    def _on_deadline(self, request: _Request, stage: StageConfig) -> None:
        if request.closed or request.stage is not stage:
            return
        logger.warning(
            "request %s: stage %d deadline of %g s expired",
            request.request_id,
            stage.id,
            stage.timeout_s,
        )
        self._close(
            request,
            OmniStageTimeoutError(
                f"Stage {stage.id} ({stage.name}) did not finish within "
                f"{stage.timeout_s:g} s.",
                stage_id=stage.id,
            ),
        )
        self._abort_everywhere(request, "timeout")

    def abort(self, request_id: str, *, reason: AbortReason = "abort") -> None:
        """Abort an in-flight request in every stage; its stream then ends with
        a final output whose ``finish_reason`` is ``"abort"``, as upstream's
        does. Unknown or finished ids are ignored."""
        request = self._requests.get(request_id)
        if request is None or request.closed:
            return
        self._close(request, _ABORTED)
        self._abort_everywhere(request, reason)

    def _abort_everywhere(self, request: _Request, reason: AbortReason | None) -> None:
        """Tell every stage; ``reason`` is counted (None: counted by the caller,
        or not an abort of the client's making)."""
        if reason is not None:
            ABORTS_TOTAL.labels(reason).inc()
        for handle in self._handles.values():
            self._post(handle, m.Abort(request_id=request.wire_id))

    def _close(self, request: _Request, error: BaseException | _Aborted) -> None:
        request.closed = True
        self._cancel_timer(request)
        self._release(request)
        request.queue.put_nowait(error)

    def _close_requests(self, error_for: Any) -> None:
        for request in list(self._requests.values()):
            if not request.closed:
                self._close(request, error_for(request))

    @staticmethod
    def _cancel_timer(request: _Request) -> None:
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None

    # -- utilities -------------------------------------------------------------

    async def call_utility(self, method: str, timeout_s: float = 5.0) -> dict[int, Any]:
        """Ask every stage that is up; a stage that cannot answer maps to ``None``."""
        loop = asyncio.get_running_loop()
        futures: dict[int, asyncio.Future[Any]] = {}
        for stage_id, handle in self._handles.items():
            alive = handle.process is None or handle.process.is_alive()
            if handle.inline is not None:
                continue
            if handle.ready.done() and not handle.ready.exception() and alive:
                call_id = next(self._call_ids)
                futures[stage_id] = self._calls[call_id] = loop.create_future()
                self._post(handle, m.UtilityRequest(call_id=call_id, method=method))
        if futures:
            await asyncio.wait(futures.values(), timeout=timeout_s)
        results: dict[int, Any] = {}
        for stage_id, handle in self._handles.items():
            if handle.inline is not None:
                results[stage_id] = handle.inline.utility(method)
                continue
            future = futures.get(stage_id)
            done = future is not None and future.done() and not future.cancelled()
            results[stage_id] = future.result() if done else None  # type: ignore[union-attr]
        for call_id in [c for c, f in self._calls.items() if f in futures.values()]:
            self._calls.pop(call_id, None)
        return results


def _choice(final: OmniRequestOutput, chunk: m.Payload) -> TextChoice:
    """Fold a text stage's chunk into its choice of ``final`` (choice 0's
    text is also ``final.text``); the updated choice."""
    while len(final.choices) <= chunk.index:
        final.choices.append(TextChoice(index=len(final.choices)))
    choice = final.choices[chunk.index]
    choice.text += chunk.text
    if chunk.index == 0:
        final.text = choice.text
    if chunk.finish_reason is not None:
        choice.finish_reason = chunk.finish_reason
    if chunk.logprobs is not None:
        choice.logprobs = _merge_logprobs(choice.logprobs, chunk.logprobs)
    return choice


def _merge_logprobs(into: Any, chunk: Any) -> Any:
    """Chat logprobs are a list of entries; completion logprobs four arrays."""
    if into is None:
        return chunk
    if isinstance(into, list):
        return into + list(chunk)
    return {key: [*(into.get(key) or ()), *(chunk.get(key) or ())] for key in chunk}


def _accumulate(into: m.Payload, chunk: m.Payload) -> None:
    into.text += chunk.text
    into.tokens.extend(chunk.tokens)
    into.images.extend(chunk.images)
    if chunk.audio is not None:
        into.audio = chunk.audio
    if chunk.video is not None:
        into.video = chunk.video
    into.meta.update(chunk.meta)


def _finish_stage(
    final: OmniRequestOutput, stage: StageConfig, result: m.Payload
) -> None:
    """Fold a finished stage's result into the request's final output."""
    if stage.kind in _TEXT_KINDS:
        final.finish_reason = final.choices[0].finish_reason if final.choices else None
    elif stage.kind == "vocoder":
        final.audio = result.audio
    elif stage.kind in ("image", "video"):
        meta = result.meta
        final.diffusion = DiffusionOutput(
            images=list(result.images),
            video=result.video,
            width=meta.get("width"),
            height=meta.get("height"),
            fps=meta.get("fps"),
            num_frames=meta.get("num_frames"),
            seed=meta.get("seed"),
        )
