"""Stages that run in the orchestrator's process: the stage contract, no hop.

Does for a request what a stage process does (normalize, log, abort, stats,
health, metrics, shutdown), in the request's own task or in one of its own
(docs/runtime.md §4). It must not decide statuses, build envelopes or
rebuild exceptions from records.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import types
from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine.stage_metrics import (
    ENGINE_PREFIX,
    engine_families,
    without_gauges,
)
from vllm_omni.engine.stage_worker import (
    Cancellable,
    StageStats,
    abort_request,
    apply_instruction,
    log_failure,
    stage_logger,
)
from vllm_omni.errors import normalize
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.stages import INLINE_KINDS, build_stage
from vllm_omni.tracing.hooks import StageSpan, stage_span
from vllm_omni.wire import hops
from vllm_omni.wire import messages as m

__all__ = ["Ended", "Failure", "InlineStage", "runs_inline"]

logger = logging.getLogger(__name__)

# A request's failure in an inline stage: its record, and what was raised.
Failure = tuple[OmniErrorDetails, BaseException]


@dataclasses.dataclass(frozen=True, slots=True)
class Ended:
    """A request's last item from ``InlineStage.drive``: ``None`` once it
    finished, or its failure."""

    failure: Failure | None


class _Driven:
    """A request's work running in its caller's task (``InlineStage.drive``):
    what an abort cancels (``abort_request``, ``cancel_all``)."""

    __slots__ = ("_cancelled", "cut", "task", "waiting")

    def __init__(self) -> None:
        # The task that reads the request now: the one an abort's cancel
        # reaches while it waits on the stage (set at each step).
        self.task: asyncio.Task[Any] | None = None
        # Aborted: no further step starts.
        self.cut = False
        # The caller's task waits on the stage now: cancelling it reaches
        # the stage's work and nothing else of the caller's.
        self.waiting = False
        self._cancelled = False

    def done(self) -> bool:
        return self.cut

    def cancel(self) -> bool:
        """End the work: its current wait is cancelled, no step follows."""
        self.cut = True
        task = self.task
        if self.waiting and task is not None and not self._cancelled:
            try:
                current = asyncio.current_task()
            except RuntimeError:  # outside a running loop (a finalizer at exit)
                current = None
            if task is not current:
                self._cancelled = task.cancel()
        return True

    def take_cancel(self) -> bool:
        """Whether the caller's task was cancelled by ``cancel`` and nothing
        else: the cancellation is taken back (``uncancel``), so the caller's
        task goes on; ``False`` when ``cancel`` did not cancel it, or when
        another cancellation is pending too (it must go on)."""
        if not self._cancelled or self.task is None:
            return False
        self._cancelled = False
        return self.task.uncancel() == 0


def runs_inline(stage: StageConfig, pipeline: PipelineConfig, local: bool) -> bool:
    """Whether ``stage`` runs in the orchestrator's process: it asks to (its
    ``in_process``, by default whether its kind is an inline kind), on an
    engine whose stages are local processes (``local``), not started by an
    operator elsewhere, and no fault drill aimed at it (a drill may exit or
    hang its process)."""
    wanted = stage.in_process
    if wanted is None:
        wanted = stage.kind in INLINE_KINDS
    return local and wanted and not stage.remote and not pipeline.faults_for(stage.id)


def _engine_collectors() -> set[Collector]:
    """The collectors of ``vllm:`` families on this process's default
    registry (vLLM's own ``unregister_vllm_metrics`` picks them this way)."""
    names = REGISTRY._collector_to_names  # private: vLLM reads it so too
    return {
        collector
        for collector, families in list(names.items())
        if any(name.startswith(ENGINE_PREFIX) for name in families)
    }


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While it lasts, ``__main__`` is a module of no file.

    A process that multiprocessing starts with ``spawn`` runs the parent's
    main module again first (to find what it unpickles): a caller's plain
    script, without the ``__main__`` guard, would start its work over in
    it. A stage process is started so that this never happens
    (``launcher``); a stage here starts its engine from the caller's
    process, and upstream's EngineCore is such a process (vLLM's CPU build
    always spawns it). It needs nothing of the caller's module: it is hidden
    while the stage starts."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class InlineStage:
    """One stage served in the orchestrator's process."""

    def __init__(
        self,
        config: StageConfig,
        pipeline: PipelineConfig,
        *,
        log_level: int,
        log_tracebacks: bool,
    ) -> None:
        self.config = config
        self._stage = build_stage(config, pipeline)
        self._stats = StageStats()
        self._active: set[str] = set()
        # Each request's running work, by request id (``drive``).
        self._tasks: dict[str, _Driven] = {}
        self._log = stage_logger(config.id, log_level, log_tracebacks)
        # The engine metrics this stage's engine registered (``start``).
        self._metrics = CollectorRegistry(auto_describe=True)
        # Its engine registered some: the orchestrator exports them.
        self.exports_metrics = False
        # The default registry's size when this stage last looked at it.
        self._collectors_seen = 0
        self._closed = False

    async def start(self) -> None:
        if not self._stage.ENGINE_METRICS:
            # Nothing of the default registry is its (a guardrail starting
            # beside a vllm stage would take what that engine registers).
            await self._stage.start()
            return
        before = _engine_collectors()
        try:
            with _main_module_hidden():
                await self._stage.start()
        finally:
            # Whatever its engine registered, even if the start then failed
            # (a second engine's start would unregister it: vLLM's rule).
            self._adopt(_engine_collectors() - before)

    def _adopt(self, collectors: set[Collector]) -> None:
        """Move engine collectors from the default registry to this stage's.

        A collector whose families this stage already has belongs to another
        engine in this process (a caller's own ``AsyncLLM``, built after
        this stage started): it stays where it is, and the request that
        looked is not failed for it."""
        for collector in collectors:
            try:
                self._metrics.register(collector)
            except ValueError:  # prometheus_client's duplicate names
                continue
            with contextlib.suppress(KeyError):
                REGISTRY.unregister(collector)
            self.exports_metrics = True
        self._collectors_seen = len(REGISTRY._collector_to_names)

    def _adopt_late_metrics(self) -> None:
        """Engine families registered after the start (on a first use) are
        this stage's too; looked for only when the default registry grew, so
        a request costs a length check. Only a stage with an engine looks."""
        if (
            self._stage.ENGINE_METRICS
            and len(REGISTRY._collector_to_names) != self._collectors_seen
        ):
            self._adopt(_engine_collectors())

    # -- requests (in the task of whoever reads the request's outputs) ---------

    async def drive(self, request: m.Submit) -> AsyncGenerator[m.Payload | Ended, None]:
        """Run one request in the caller's task: its payloads as they come,
        then ``Ended`` with its failure or ``None``.

        The stage's work runs while the caller waits for the next item, as
        upstream's ``AsyncLLM.generate`` runs in its caller's task: no task
        of its own, no hand-over between two, and no generator between the
        stage's and this one. An abort (``abort``, a deadline, the engine's
        death) ends it: while the caller waits on the stage, by cancelling
        the caller's task for that wait only (the cancellation is taken
        back, the caller's task goes on); at any other time the next step
        does not start. Then the generator ends without ``Ended``: whoever
        aborted queued the request's end."""
        stage = self.config
        stage_id = stage.id
        request_id = request.request_id
        driven = _Driven()
        self._tasks[request_id] = driven
        hops.mark(request_id, "stage.started", stage_id)
        self._stats.submitted += 1
        self._active.add(request_id)
        span = stage_span(
            request_id,
            request.trace,
            stage_id=stage_id,
            name=stage.name,
            kind=stage.kind,
        )
        # The stage's engine continues this stage's span (a vllm stage).
        request.trace = span.headers(request.trace)
        payloads = self._stage.generate(request)
        # Each request ends its span exactly once.
        span_open = True
        # Until the work ended, or an abort ended it: the reader went away
        # mid-work (a cancellation that is not this stage's, the generator
        # closed), and the orchestrator's abort of the request follows.
        interrupted = True
        try:
            while not driven.cut:
                ended: Ended | None = None
                # The task that reads now: a streamed response reads its
                # first output in the route's task, the rest in its own.
                task = driven.task = asyncio.current_task()
                driven.waiting = True
                try:
                    payload = await anext(payloads)
                except StopAsyncIteration:
                    self._stats.completed += 1
                    span_open = False
                    span.finish()
                    hops.mark(request_id, "stage.finished", stage_id)
                    ended = Ended(None)
                except asyncio.CancelledError as exc:
                    if task is None or not task.cancelling():
                        # The stage's own CancelledError: its failure.
                        span_open = False
                        ended = Ended(self._fail(request_id, exc, span))
                    elif driven.take_cancel():
                        break  # this stage's abort: the caller's task goes on
                    else:
                        raise  # the reader's own cancellation
                except (KeyboardInterrupt, SystemExit, GeneratorExit):
                    raise
                except BaseException as exc:  # every other failure: a record
                    span_open = False
                    ended = Ended(self._fail(request_id, exc, span))
                finally:
                    driven.waiting = False
                if driven.take_cancel():
                    continue  # the stage swallowed the abort's cancellation
                if ended is not None:
                    interrupted = False
                    # No longer active before the orchestrator hears of the
                    # end (whoever reads it may ask for ``stats`` next), as a
                    # stage process's ``_ended``.
                    self._ended(request_id)
                    yield ended
                    return
                hops.mark(request_id, "stage.payload", stage_id)
                yield payload
            interrupted = False
        finally:
            if span_open:
                # An abort, a deadline, the consumer gone: no record.
                span.abort()
            # The reader going away closes the stage's work now.
            await payloads.aclose()
            self._ended(request_id)
            if interrupted and not driven.cut:
                # Its running work was cancelled: the abort that follows
                # finds it so (``abort_request``), then it is forgotten.
                try:
                    asyncio.get_running_loop().call_soon(
                        self._forget, request_id, driven
                    )
                except RuntimeError:  # outside a running loop
                    self._forget(request_id, driven)
            else:
                self._forget(request_id, driven)

    def _forget(self, request_id: str, work: Cancellable) -> None:
        if self._tasks.get(request_id) is work:
            del self._tasks[request_id]

    def _ended(self, request_id: str) -> None:
        """The request is no longer active here (once: ``discard``); engine
        families its work registered are this stage's too."""
        if request_id in self._active:
            self._active.discard(request_id)
            self._adopt_late_metrics()

    def _fail(self, request_id: str, exc: BaseException, span: StageSpan) -> Failure:
        hops.mark(request_id, "stage.failing", self.config.id)
        self._stats.failed += 1
        details = normalize(exc, request_id=request_id, stage_id=self.config.id)
        log_failure(self.config.id, request_id, details, exc, self._log)
        span.fail(details)
        hops.mark(request_id, "stage.failed", self.config.id)
        return details, exc

    def abort(self, request_id: str) -> None:
        """An abort reached this stage: its running work is cancelled."""
        abort_request(self._stats, self._tasks, self.config.id, request_id, self._log)

    def cancel_all(self) -> None:
        """Cancel every request's running work (the engine died): as a dead
        stage process's work stops. Not an abort: nothing is logged."""
        for work in list(self._tasks.values()):
            with contextlib.suppress(RuntimeError):  # its loop closed already
                work.cancel()

    # -- liveness, metrics, shutdown -------------------------------------------

    def health(self) -> BaseException | None:
        """``None`` while the stage can serve; else what its ``check_health``
        raised (its death)."""
        if self._closed:
            return None
        try:
            self._stage.check_health()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a stage that cannot serve: its death
            return exc
        return None

    def fault_status(self) -> tuple[dict[str, Any] | None, float | None]:
        """The engine's fault-tolerance status and recovery window, as a
        stage process reports them with its heartbeat (``None`` without
        fault tolerance, or when asking raised: logged)."""
        if self._closed:
            return None, None
        try:
            status = self._stage.fault_status()
            if status is None:
                return None, None
            return dict(status), self._stage.recovery_window_s()
        except Exception:
            logger.exception("stage %d: fault_status failed", self.config.id)
            return None, None

    async def handle_fault(
        self, instruction: str, params: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        """A fault-tolerance instruction, applied as a stage process applies it."""
        return await apply_instruction(
            self._stage, self.config.id, instruction, params, request_id, self._log
        )

    def stage_families(self) -> Iterable[tuple[int, list[Metric]]]:
        """This stage's engine families (``StageMetricsSource``): no gauges
        once it can no longer serve or was shut down."""
        if not self._closed:
            self._adopt_late_metrics()
        families = engine_families(self._metrics.collect())
        if not families:
            return
        serving = not self._closed and self.health() is None
        yield self.config.id, families if serving else without_gauges(families)

    def close(self) -> None:
        """Cancel what still runs and shut the stage down (its EngineCore
        too); idempotent. The stage's ``shutdown`` must not wait on anything
        (``Stage.shutdown``): it runs to its end here, inside or outside a
        running loop."""
        if self._closed:
            return
        self._closed = True
        self.cancel_all()
        closing = self._stage.shutdown()
        try:
            closing.send(None)
        except StopIteration:
            return
        except Exception:
            logger.exception("stage %d failed to shut down", self.config.id)
            return
        closing.close()
        logger.warning(
            "stage %d: its shutdown waited on something; it was not finished",
            self.config.id,
        )

    def utility(self, method: str) -> Any:
        """What a stage process answers to a utility call (``hops``: nothing,
        this process's marks are the orchestrator's)."""
        if method == "stats":
            active = self._active | set(self._tasks)
            return self._stats.report(self.config, active, compact=True)
        if method == "hops":
            return []
        return {"error": f"unknown utility {method!r}"}
