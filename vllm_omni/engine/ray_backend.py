"""The Ray worker backend: each stage runs as a Ray actor.

Owns everything Ray-specific: the cluster, the actors, Ray's failure modes,
their metrics and the request-time probe (docs/runtime.md §10). It must not
classify stage errors, mark the engine dead or fail requests, and what it
reports never reaches a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

from vllm_omni.config import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_RAY_PROBE_INTERVAL_S,
    DEFAULT_RAY_PROBE_TIMEOUT_S,
    PipelineConfig,
    StageConfig,
)
from vllm_omni.engine.stage_handle import LauncherHooks, StageStartupError
from vllm_omni.engine.stage_metrics import (
    STAGE_METRICS,
    engine_families,
    without_gauges,
)
from vllm_omni.engine.stage_worker import StageWorker, WorkerSpec
from vllm_omni.errors import (
    OmniServiceUnavailableError,
)
from vllm_omni.errors.logs import install_log_redaction
from vllm_omni.tracing.provider import configure, flush

__all__ = [
    "RAY_FAILURES",
    "RAY_PROBE_FAILURES",
    "RayStageLauncher",
    "describe_exit",
]

logger = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 10.0
_PROBE_GROUP = "probe"
_METRICS_GROUP = "metrics"
# How long a scrape waits for the stage actors' metrics, all together.
_METRICS_TIMEOUT_S = 2.0
# The GCS call of the cluster probe: an existence check of an unused key.
_PROBE_KEY = b"vllm-omni-probe"
_PROBE_NAMESPACE = b"vllm-omni"
# Ray failure class name → why the stage's run call ended, as logged and
# kept in OmniEngineDeadError.reason. Names, not classes: Ray stays unimported.
RAY_FAILURES: Mapping[str, str] = {
    "ActorDiedError": "its Ray actor died (killed, node lost or out of memory)",
    "ActorUnavailableError": "its Ray actor became unreachable",
    "OutOfMemoryError": "its Ray worker was killed for running out of memory",
    "NodeDiedError": "its Ray node died",
    "WorkerCrashedError": "its Ray worker process crashed",
    "RayTaskError": "the stage actor raised outside any request",
    "RaySystemError": "its Ray run call failed with a system error",
}
# What the request-time probe saw → who is unavailable ("stage": the pinged
# stage; "cluster": every stage, for new requests) and why, as logged. None
# of these is fatal by itself; a stage silent for heartbeat_timeout_s is.
# A ping that fails fast (the actor died, or the connection to it broke:
# ActorDiedError, ActorUnavailableError) is not silence: its run call's end
# or the heartbeat decides whether the stage is dead.
RAY_PROBE_FAILURES: Mapping[str, tuple[str, str]] = {
    "GetTimeoutError": ("stage", "its Ray actor did not answer its probe in time"),
    "RpcError": ("cluster", "the Ray GCS did not answer in time"),
}


def describe_exit(error: BaseException | None, exit_code: object = None) -> str:
    """Why a stage's ``run`` call ended, without Ray's remote traceback or
    addresses (those stay in the log line of the full exception)."""
    if error is None:
        if exit_code == 0:
            # A worker returns 0 unasked only when orphaned: its raylet (its
            # node) went away, or the orchestrator fell silent.
            return "stage actor exited with code 0 (its Ray node was lost)"
        return f"stage actor exited with code {exit_code}"
    for cls in type(error).__mro__:
        reason = RAY_FAILURES.get(cls.__name__)
        if reason is not None:
            return f"{reason} ({type(error).__name__})"
    return f"its Ray actor failed ({type(error).__name__})"


class _StageActor:
    """The body of a stage's Ray actor: runs one ``StageWorker`` to its end,
    and answers the launcher's probe meanwhile."""

    def ping(self) -> int:
        """Liveness, run in the actor's probe group (its own thread, beside
        ``run``): this worker's process id."""
        return os.getpid()

    def metrics(self) -> list[Metric]:
        """The ``vllm:`` families of this actor's registry (its stage's
        engine), run in the actor's metrics group (a thread of its own)."""
        return engine_families(REGISTRY.collect())

    def run(self, spec: WorkerSpec) -> int:
        logging.basicConfig(
            level=logging.INFO,
            format=f"%(levelname)s stage-{spec.stage.id} %(message)s",
        )
        install_log_redaction()
        configure(spec.pipeline.otlp_traces_endpoint, process=f"stage-{spec.stage.id}")
        worker = StageWorker(spec)
        try:
            code = asyncio.run(worker.serve())
        finally:
            worker.close()
            flush()
        if worker.orphaned:
            # Nobody will use or kill this actor: its orchestrator is gone or
            # cut off (its node partitioned). Its process must not linger on
            # that host, holding the stage's resources. Not exit_actor(): it
            # first reports to the GCS, which a partition makes wait ~12 s
            # more; the raylet sees this exit and reports it when it can.
            logging.shutdown()
            os._exit(0)
        return code


def _actor_options(stage: StageConfig, name: str, namespace: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "num_cpus": stage.ray.num_cpus,
        "num_gpus": stage.ray.num_gpus,
        # A dead stage is the engine's death (docs/design.md §6): never restart it
        # behind the orchestrator's back.
        "max_restarts": 0,
        "max_task_retries": 0,
        # The stage's run call owns the default group for its lifetime; the
        # probe's pings have a group (a thread) of their own (see launch).
        "max_concurrency": 1,
    }
    if stage.ray.resources:
        options["resources"] = dict(stage.ray.resources)
    if stage.ray.label_selector:
        options["label_selector"] = dict(stage.ray.label_selector)
    return options


def _wanted(stage: StageConfig) -> dict[str, float]:
    wanted = {"CPU": stage.ray.num_cpus, "GPU": stage.ray.num_gpus}
    wanted.update(stage.ray.resources)
    return {name: amount for name, amount in wanted.items() if amount > 0}


def _absent(stage: StageConfig, total: Mapping[str, float]) -> dict[str, float]:
    """What a stage asks for beyond what the whole cluster has."""
    return {k: v for k, v in _wanted(stage).items() if total.get(k, 0.0) < v}


def _waiting_for(stage: StageConfig, total: Mapping[str, float]) -> str:
    """The resources a stage waits for: those the cluster lacks, else all it
    asked for (then they are busy, or the actor is still starting)."""
    absent = _absent(stage, total)
    parts = [f"{k}={v:g}" for k, v in sorted((absent or _wanted(stage)).items())]
    parts += [f"label {k}={v}" for k, v in stage.ray.label_selector.items()]
    what = ", ".join(parts) or "no resources"
    return f"missing: {what}" if absent else f"requested: {what}"


def _stay_on_loopback(ray: Any) -> None:
    """Keep the Ray instance this engine starts on 127.0.0.1 even where the
    caller imported Ray before ``prepare`` could set Ray's not-a-cluster flag
    (vLLM's ``AsyncLLM`` imports Ray): Ray read the flag then, and resolves
    any local address, 127.0.0.1 too, to this host's public one while it is
    set. Ray reads its constant at each call, so it is cleared there."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if getattr(constants, "ENABLE_RAY_CLUSTER", False):
        logger.info(
            "Ray was imported before the engine: its local instance is kept "
            "on 127.0.0.1 all the same"
        )
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[union-attr]


class RayStageLauncher:
    """Starts a pipeline's stages as Ray actors and reports when they end."""

    def __init__(
        self,
        *,
        address: str | None = None,
        stage_init_timeout_s: float = 120.0,
        probe_interval_s: float = DEFAULT_RAY_PROBE_INTERVAL_S,
        probe_timeout_s: float = DEFAULT_RAY_PROBE_TIMEOUT_S,
        orchestrator_timeout_s: float = 2 * DEFAULT_HEARTBEAT_TIMEOUT_S,
    ) -> None:
        self._address = address
        self._stage_init_timeout_s = stage_init_timeout_s
        self._probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._orchestrator_timeout_s = orchestrator_timeout_s
        self._probe: _Probe | None = None
        self._metrics: _ActorMetrics | None = None
        self._namespace = f"vllm-omni-{uuid.uuid4().hex[:12]}"
        self._owns_ray = False
        self._actors: dict[int, Any] = {}
        self._runs: dict[int, Any] = {}
        self._waiters: list[asyncio.Task[None]] = []

    @property
    def namespace(self) -> str:
        """The Ray namespace of this engine's actors (``omni-stage-<id>``)."""
        return self._namespace

    # -- StageLauncher -----------------------------------------------------------

    def prepare(self) -> str:
        if self._address is None and "ray" not in sys.modules:
            # Ray binds a local instance to this host's public address unless
            # told it is not a cluster; read once, when Ray is first imported.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        if not ray.is_initialized():
            self._check_reachable()
            if self._address is None:
                _stay_on_loopback(ray)
            try:
                ray.init(
                    address=self._address,
                    include_dashboard=False,
                    namespace=self._namespace,
                    log_to_driver=True,
                    configure_logging=False,
                )
            except Exception as exc:
                logger.error("could not start or join Ray", exc_info=exc)
                raise OmniServiceUnavailableError(
                    f"The Ray cluster is unreachable ({type(exc).__name__})."
                ) from None
            self._owns_ray = True
        return str(ray.util.get_node_ip_address())

    def _check_reachable(self) -> None:
        """Fail fast on a cluster address nothing listens at: ``ray.init``
        itself retries such an address for minutes."""
        host, _, port = (self._address or "").rpartition(":")
        if not host or not port.isdigit():
            return  # no address, "auto", or a scheme Ray resolves itself
        try:
            timeout = min(self._stage_init_timeout_s, _CONNECT_TIMEOUT_S)
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except OSError as exc:
            logger.error("Ray cluster %s unreachable: %s", self._address, exc)
            raise OmniServiceUnavailableError(
                f"The Ray cluster is unreachable ({type(exc).__name__})."
            ) from None

    async def launch(
        self,
        pipeline: PipelineConfig,
        address: str,
        hooks: LauncherHooks,
    ) -> None:
        import ray

        actor_class = ray.remote(
            concurrency_groups={_PROBE_GROUP: 1, _METRICS_GROUP: 1}
        )(_StageActor)
        # Where an operator finds them (ray list actors --filter namespace=...).
        logger.info("stage actors: Ray namespace %s", self._namespace)
        for stage in pipeline.stages:
            options = _actor_options(stage, f"omni-stage-{stage.id}", self._namespace)
            self._actors[stage.id] = actor_class.options(**options).remote()
        placed = {
            stage.id: asyncio.wrap_future(
                self._actors[stage.id].__ray_ready__.remote().future()
            )
            for stage in pipeline.stages
        }
        _, pending = await asyncio.wait(
            placed.values(), timeout=self._stage_init_timeout_s
        )
        for stage in pipeline.stages:
            future = placed[stage.id]
            if future in pending:
                future.cancel()
                continue
            error = future.exception()
            if error is not None:
                logger.error("stage %d actor failed to start", stage.id, exc_info=error)
                raise StageStartupError(stage, describe_exit(error))
        if pending:
            total = ray.cluster_resources()
            waiting = [s for s in pipeline.stages if placed[s.id] in pending]
            # Name a stage the cluster cannot place at all before a slow one.
            waiting.sort(key=lambda s: not _absent(s, total))
            stage = waiting[0]
            reason = (
                f"not placed on the Ray cluster within "
                f"{self._stage_init_timeout_s:g} s ({_waiting_for(stage, total)})"
            )
            logger.error(
                "stage %d (%s) %s; also waiting: %s",
                stage.id,
                stage.name,
                reason,
                ", ".join(str(s.id) for s in waiting[1:]) or "none",
            )
            raise StageStartupError(stage, reason)
        for stage in pipeline.stages:
            spec = WorkerSpec(
                stage=stage,
                pipeline=pipeline,
                address=address,
                orchestrator_timeout_s=self._orchestrator_timeout_s,
            )
            run = self._actors[stage.id].run.remote(spec)
            self._runs[stage.id] = run
            self._waiters.append(
                asyncio.create_task(
                    self._wait_exit(stage.id, run, hooks.exited),
                    name=f"omni-ray-stage-{stage.id}",
                )
            )
        self._metrics = _ActorMetrics(dict(self._actors))
        STAGE_METRICS.add(self._metrics)
        self._probe = _Probe(
            dict(self._actors),
            hooks,
            asyncio.get_running_loop(),
            interval_s=self._probe_interval_s,
            timeout_s=self._probe_timeout_s,
        )
        self._probe.start()

    def stop(self, timeout_s: float) -> None:
        for waiter in self._waiters:
            waiter.cancel()
        if self._metrics is not None:
            STAGE_METRICS.remove(self._metrics)
            self._metrics = None
        if self._probe is not None:
            self._probe.stop()
            self._probe = None
        if "ray" not in sys.modules:
            return
        import ray

        if not ray.is_initialized():
            return
        # The orchestrator already sent Shutdown: give the workers a moment
        # to close their stages, then make sure no actor outlives the engine.
        if self._runs:
            ray.wait(
                list(self._runs.values()),
                num_returns=len(self._runs),
                timeout=max(0.1, timeout_s),
            )
        for actor in self._actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._actors.clear()
        self._runs.clear()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    # -- liveness ----------------------------------------------------------------

    async def _wait_exit(
        self, stage_id: int, run: Any, on_exit: Callable[[int, str], None]
    ) -> None:
        try:
            code = await asyncio.wrap_future(run.future())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Full text (remote traceback, node address) for the operator only.
            logger.error("stage %d Ray actor ended", stage_id, exc_info=exc)
            on_exit(stage_id, describe_exit(exc))
            return
        on_exit(stage_id, describe_exit(None, code))


class _ActorMetrics:
    """The stage actors' engine metrics, asked for at each scrape (from the
    scrape's thread): one call per actor at a time, all bounded together by
    ``_METRICS_TIMEOUT_S``. An actor that does not answer in time (dead,
    stopped, cut off) is shown with the counters and histograms it last
    reported, without gauges; its call, still pending, is waited for at the
    next scrape instead of being sent again."""

    def __init__(self, actors: Mapping[int, Any]) -> None:
        self._actors = dict(actors)
        self._pending: dict[int, Any] = {}
        self._last: dict[int, list[Metric]] = {}
        self._lock = threading.Lock()

    def stage_families(self) -> list[tuple[int, list[Metric]]]:
        import ray

        with self._lock:  # one scrape at a time asks the actors
            for stage_id, actor in self._actors.items():
                if stage_id not in self._pending:
                    call = actor.metrics.options(concurrency_group=_METRICS_GROUP)
                    self._pending[stage_id] = call.remote()
            deadline = time.monotonic() + _METRICS_TIMEOUT_S
            found: list[tuple[int, list[Metric]]] = []
            for stage_id in self._actors:
                left = max(0.0, deadline - time.monotonic())
                try:
                    families = ray.get(self._pending[stage_id], timeout=left)
                except Exception as exc:
                    if not isinstance(exc, ray.exceptions.GetTimeoutError):
                        self._pending.pop(stage_id)  # it failed: ask again
                    found.append(
                        (stage_id, without_gauges(self._last.get(stage_id, [])))
                    )
                    continue
                self._pending.pop(stage_id)
                self._last[stage_id] = families
                found.append((stage_id, families))
            return found


class _Probe:
    """Pings the stage actors and calls the GCS, from a thread of its own.

    Every ``interval_s``: one ``ping`` per stage (a ping still unanswered is
    waited for, never sent again, so a stopped actor does not pile them up)
    and one GCS call, each bounded by ``timeout_s`` (``ray.get(...,
    timeout=...)``: ``GetTimeoutError``; the GCS client: ``RpcError``).
    Changes are handed to the engine's loop. Only a ping that times out
    makes a stage silent; one that fails otherwise (the actor died, or the
    connection to it broke) is left to its ``run`` call's waiter and the
    heartbeat, which decide whether the stage is dead.
    """

    def __init__(
        self,
        actors: Mapping[int, Any],
        hooks: LauncherHooks,
        loop: asyncio.AbstractEventLoop,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self._actors = dict(actors)
        self._hooks = hooks
        self._loop = loop
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="omni-ray-probe", daemon=True
        )
        self._pending: dict[int, tuple[Any, float]] = {}
        self._silent: set[int] = set()
        self._reachable = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            # At most one probe call is in progress, bounded by its timeout.
            self._thread.join(timeout=self._timeout_s + 1.0)

    def _report(self, hook: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self._loop.call_soon_threadsafe(hook, *args)

    def _run(self) -> None:
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        gcs = internal_kv_get_gcs_client()
        while not self._stopping.wait(self._interval_s):
            try:
                self._probe_cluster(gcs)
                self._probe_stages()
            except Exception:
                # A round that could not even ask (Ray shutting down under
                # it): the next round asks again, or stop() ends the thread.
                logger.debug("Ray probe round failed", exc_info=True)

    def _probe_cluster(self, gcs: Any) -> None:
        try:
            gcs.internal_kv_exists(
                _PROBE_KEY, _PROBE_NAMESPACE, timeout=self._timeout_s
            )
        except Exception as exc:
            if self._reachable:
                self._reachable = False
                logger.warning(
                    "Ray cluster probe failed: %s (%s)",
                    _probe_reason(exc),
                    _first_line(exc),
                )
                self._report(self._hooks.reachable, False)
            return
        if not self._reachable:
            self._reachable = True
            logger.info("Ray cluster probe answered again")
            self._report(self._hooks.reachable, True)

    def _probe_stages(self) -> None:
        import ray

        now = time.monotonic()
        for stage_id, actor in self._actors.items():
            if stage_id not in self._pending:
                ping = actor.ping.options(concurrency_group=_PROBE_GROUP).remote()
                self._pending[stage_id] = (ping, now)
        for stage_id, (ping, sent) in list(self._pending.items()):
            left = max(0.0, sent + self._timeout_s - time.monotonic())
            try:
                ray.get(ping, timeout=left)
            except Exception as exc:
                row = _probe_row(exc)
                if row is not None and row[0] == "stage":
                    self._changed(stage_id, False, exc)  # still waited for
                    continue
                self._pending.pop(stage_id)  # ping again next round
                logger.debug("stage %d probe: %s", stage_id, type(exc).__name__)
                continue
            self._pending.pop(stage_id)
            self._changed(stage_id, True, None)

    def _changed(self, stage_id: int, answering: bool, exc: Exception | None) -> None:
        if answering is (stage_id not in self._silent):
            return
        if answering:
            self._silent.discard(stage_id)
            logger.info("stage %d answers its Ray probe again", stage_id)
        else:
            self._silent.add(stage_id)
            assert exc is not None
            logger.warning(
                "stage %d: %s (%g s)", stage_id, _probe_reason(exc), self._timeout_s
            )
        self._report(self._hooks.answering, stage_id, answering)


def _probe_row(exc: BaseException) -> tuple[str, str] | None:
    """The ``RAY_PROBE_FAILURES`` row of a probe's exception, if any."""
    for cls in type(exc).__mro__:
        row = RAY_PROBE_FAILURES.get(cls.__name__)
        if row is not None:
            return row
    return None


def _probe_reason(exc: BaseException) -> str:
    row = _probe_row(exc)
    what = row[1] if row is not None else "its Ray probe failed"
    return f"{what} ({type(exc).__name__})"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
