"""The orchestrator: moves each request through its stages, as vLLM's
``AsyncLLM`` moves it through its engine core (docs/runtime.md §5).

It keeps the request flow and hands the rest to its collaborators. It must
not classify exceptions (stages normalize, ``to_exception`` rebuilds) and
must not render anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine.inline import Ended, Failure
from vllm_omni.engine.input_processor import check_inputs, for_stage
from vllm_omni.engine.merging import TEXT_KINDS, accumulate, fold_choice, fold_stage
from vllm_omni.engine.request_table import (
    DEFAULT_MAX_NUM_QUEUED_REQS,
    Aborted,
    Request,
    RequestTable,
)
from vllm_omni.engine.routing import Routes
from vllm_omni.engine.stage_channel import StageChannel, Transport
from vllm_omni.engine.stage_handle import StageHandle, StageLauncher
from vllm_omni.engine.supervisor import Supervisor
from vllm_omni.errors import (
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    VLLMValidationError,
    fatal_reason,
)
from vllm_omni.errors.metrics import AbortReason, record_abort
from vllm_omni.errors.normalizer import stage_failure
from vllm_omni.outputs import OmniRequestOutput
from vllm_omni.tracing.hooks import submission_headers
from vllm_omni.wire import hops
from vllm_omni.wire import messages as m

__all__ = ["Orchestrator"]


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
        self.pipeline = pipeline
        self.channel = StageChannel(transport, host, port, self._receive)
        self.requests = RequestTable(pipeline, max_num_queued_reqs, self.channel)
        self.supervisor = Supervisor(
            pipeline,
            self.channel,
            self.requests,
            launcher=launcher,
            startup_timeout_s=startup_timeout_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            silence_timeout_s=silence_timeout_s,
            death_grace_s=death_grace_s,
        )
        self.routes = Routes(pipeline)
        self.modalities = self.routes.modalities
        self.max_num_queued_reqs = self.requests.max_num_queued_reqs

    # -- state -----------------------------------------------------------------

    @property
    def address(self) -> str:
        """Where stages connect (``ipc://`` or ``tcp://``), once started."""
        return self.channel.address

    @property
    def dead_error(self) -> OmniEngineDeadError | None:
        """The error that killed the engine, or ``None`` while it is healthy."""
        return self.supervisor.dead

    @property
    def is_running(self) -> bool:
        return self.supervisor.started and self.supervisor.serving()

    def stage_pids(self) -> dict[int, int | None]:
        return {sid: handle.pid for sid, handle in self.supervisor.handles.items()}

    def stage_for(self, modality: str) -> StageConfig | None:
        """The first stage producing ``modality``."""
        return self.routes.stage_for(modality)

    def route(self, modalities: Iterable[str]) -> tuple[StageConfig, ...]:
        """The stages a request for ``modalities`` goes through (``Routes``)."""
        return self.routes.route(modalities)

    # -- startup and shutdown -------------------------------------------------

    async def start(self) -> None:
        """Bind, start the stages, and wait until every stage is ready."""
        if self.supervisor.started or self.supervisor.closed:
            raise RuntimeError("an orchestrator starts once")
        await self.supervisor.start()

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Stop every stage and release sockets; idempotent. Call it from the
        engine's loop thread (or after that loop stopped)."""
        self.supervisor.shutdown(timeout_s)

    # -- what stages send ------------------------------------------------------

    def _receive(self, handle: StageHandle, message: m.Message) -> None:
        stage_id = handle.config.id
        if isinstance(message, m.Output):
            hops.mark(message.request_id, "orchestrator.received", stage_id)
            self.requests.deliver(stage_id, message)
        elif isinstance(message, m.ErrorMessage):
            hops.mark(message.request_id or "", "orchestrator.error", stage_id)
            details = message.to_details()
            if not self.supervisor.on_stage_error(handle, details, message.reason):
                self.requests.fail(stage_id, details)
        elif isinstance(message, m.Ready):
            self.supervisor.on_ready(handle, message)
        elif isinstance(message, m.Heartbeat):
            self.supervisor.recovery.on_engine_status(
                handle, message.engine_status, message.recovery_window_s
            )

    def check_admission(self, request_id: str) -> None:
        """``QueueOverflowError`` (503) now if admission would refuse
        ``request_id``: the engine-wide limit (``RequestTable``); a stage's
        own limit is known once the request is routed, in ``generate``."""
        self.requests.check_admission(request_id)

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """``check_admission``, then a place held for ``request_id`` until it
        is admitted or the context ends (``request_table.AdmissionHolds``)."""
        return self.requests.hold_admission(request_id)

    # -- fault tolerance -------------------------------------------------------

    def check_faulted(self) -> None:
        """Raise the faulted record of the first faulted stage (``/health``)."""
        self.supervisor.recovery.check_faulted()

    def apply_fault_instruction(
        self,
        stage_id: int,
        instruction: str,
        params: Mapping[str, Any],
        request_id: str,
    ) -> None:
        """Start a fault-tolerance instruction at a stage's engine
        (``Recovery.apply``), while the engine serves."""
        self.supervisor.check_serving()
        self.supervisor.recovery.apply(stage_id, instruction, params, request_id)

    def fault_tolerant_stages(self) -> list[int]:
        """The stages whose engine reported a fault-tolerance status."""
        return self.supervisor.recovery.tolerant_stages()

    def faulted_stages(self) -> list[StageConfig]:
        """The stages whose engine is faulted now (diagnosing or unhealthy)."""
        return [h.config for h in self.supervisor.handles.values() if h.fault.faulted]

    def fault_tolerance_status(self) -> list[dict[str, Any]]:
        """Each stage's status as ``/v1/fault_tolerance/status`` shows it."""
        return self.supervisor.recovery.status()

    # -- requests --------------------------------------------------------------

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
        ``params`` for their stage (``input_processor.for_stage``). Each
        submission carries the request's trace headers
        (``tracing.hooks.submission_headers``)."""
        hops.mark(request_id, "orchestrator.generate")
        self.supervisor.check_serving(request_id)
        wanted = frozenset(modalities)
        route = self.routes.route(wanted)
        check_inputs(prompt, params, stage_params or {}, route)
        self.requests.check_new(request_id)
        self.supervisor.watch.check_reachable(route[0])
        for stage in route:
            self.supervisor.watch.check_answering(stage, request_id)
        request = self.requests.open(request_id)
        try:
            # The route's stages in this generator itself, not one it wraps:
            # a layer less for every output to pass through.
            final = OmniRequestOutput(request_id=request_id)
            params = dict(params)
            per_stage = stage_params or {}
            trace = submission_headers(trace_headers)
            inputs: m.Payload | None = None
            for stage in route:
                submit = m.Submit(
                    request_id=request.wire_id,
                    prompt=prompt,
                    params=for_stage(params, per_stage.get(stage.id)),
                    inputs=inputs,
                    trace=trace,
                )
                self._submit(request, stage, submit)
                inline = self.supervisor.handles[stage.id].inline
                # A stage in this process runs in this task, a step whenever
                # nothing else is queued for the request (``InlineStage.drive``).
                work = None if inline is None else inline.drive(submit)
                result = m.Payload()
                try:
                    while True:
                        if work is not None and request.queue.empty():
                            if not await self._step(request, stage, work):
                                await work.aclose()
                                work = None
                            continue
                        item = await request.queue.get()
                        if isinstance(item, BaseException):
                            raise item
                        if isinstance(item, Aborted):
                            final.finished = True
                            final.finish_reason = "abort"
                            final.stage_id = stage.id
                            yield final
                            return
                        payload = item.payload
                        accumulate(result, payload)
                        if payload.meta:
                            final.meta.setdefault(stage.name, {}).update(payload.meta)
                        if "text" in wanted and stage.kind in TEXT_KINDS:
                            choice = fold_choice(final, payload)
                            if (
                                payload.text
                                or payload.finish_reason
                                or payload.logprobs
                            ):
                                hops.mark(
                                    request.wire_id, "orchestrator.yield", stage.id
                                )
                                yield OmniRequestOutput(
                                    request_id=request_id,
                                    text=choice.text,
                                    text_delta=payload.text,
                                    index=payload.index,
                                    logprobs=payload.logprobs,
                                    finish_reason=payload.finish_reason,
                                    stage_id=stage.id,
                                )
                        if item.finished:
                            break
                finally:
                    if work is not None:
                        await work.aclose()
                self.requests.cancel_timer(request)
                self.requests.release(request)
                fold_stage(final, stage, result)
                inputs = result
            request.closed = True
            final.finished = True
            final.stage_id = route[-1].id
            final.finish_reason = final.finish_reason or "stop"
            yield final
        except (asyncio.CancelledError, GeneratorExit, KeyboardInterrupt):
            if not request.closed:
                request.closed = True
                # The transport's reason (client_disconnect) when it gave one.
                record_abort("cancelled")
                self.requests.abort_everywhere(request, None)
            raise
        finally:
            self.requests.remove(request)

    def _submit(self, request: Request, stage: StageConfig, submit: m.Submit) -> None:
        self.supervisor.check_serving(request.wire_id)
        try:
            self.supervisor.watch.check_answering(stage, request.request_id)
            self.requests.enter(request, stage)
        except Exception:
            if request.stage is not None:
                # Refused mid-route (a full or silent stage): nothing may stay
                # behind in the stages it went through. Not an abort anyone
                # asked for: uncounted.
                request.closed = True
                self.requests.abort_everywhere(request, None)
            raise
        hops.mark(request.wire_id, "orchestrator.submit", stage.id)
        handle = self.supervisor.handles[stage.id]
        if handle.inline is None and not self.channel.post(handle, submit, warn=True):
            self._fail_send(request, stage)

    def _fail_send(self, request: Request, stage: StageConfig) -> None:
        if request.closed:
            return
        self.requests.close(
            request,
            OmniServiceUnavailableError(
                f"Stage {stage.id} ({stage.name}) is not reachable."
            ),
        )
        self.requests.abort_everywhere(request, None)

    async def _step(
        self,
        request: Request,
        stage: StageConfig,
        work: AsyncGenerator[m.Payload | Ended, None],
    ) -> bool:
        """One step of a stage in this process: what it gives is queued for
        ``generate`` as a stage process's message would be; ``False`` once it
        ended (finished, failed, or aborted: then the abort queued the end)."""
        item = await anext(work, None)
        if item is None:
            return False
        if isinstance(item, Ended):
            self._inline_done(request, stage, item.failure)
            return False
        self._emit(request, stage, item)
        return True

    @staticmethod
    def _emit(request: Request, stage: StageConfig, payload: m.Payload) -> None:
        if not request.closed and request.stage is stage:
            hops.mark(request.wire_id, "orchestrator.received", stage.id)
            request.queue.put_nowait(
                m.Output(request_id=request.wire_id, stage_id=stage.id, payload=payload)
            )

    def _inline_done(
        self, request: Request, stage: StageConfig, failure: Failure | None
    ) -> None:
        """A stage in this process finished the request (``failure`` is
        ``None``) or failed it: what a stage process's last message does."""
        if request.closed or request.stage is not stage:
            return  # failed, aborted or timed out meanwhile: already queued
        if failure is not None:
            details, exc = failure
            if details.fatal:
                self.supervisor.mark_dead(
                    stage.id, fatal_reason(exc) or "the stage reported a fatal error"
                )
            else:
                self.requests.close(request, stage_failure(details))
            return
        self.requests.cancel_timer(request)
        request.queue.put_nowait(
            m.Output(request_id=request.wire_id, stage_id=stage.id, finished=True)
        )

    def abort(self, request_id: str, *, reason: AbortReason = "abort") -> None:
        """Abort an in-flight request in every stage; its stream then ends with
        a final output whose ``finish_reason`` is ``"abort"``, as upstream's
        does. Unknown or finished ids are ignored."""
        self.requests.abort(request_id, reason)

    # -- utilities -------------------------------------------------------------

    async def call_utility(self, method: str, timeout_s: float = 5.0) -> dict[int, Any]:
        """Ask every stage that is up; a stage that cannot answer maps to ``None``."""
        asked: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        for stage_id, handle in self.supervisor.handles.items():
            alive = handle.process is None or handle.process.is_alive()
            if handle.inline is not None:
                continue
            if handle.ready.done() and not handle.ready.exception() and alive:
                asked[stage_id] = self.channel.ask(handle, method, {})
        if asked:
            await asyncio.wait([f for _, f in asked.values()], timeout=timeout_s)
        results: dict[int, Any] = {}
        for stage_id, handle in self.supervisor.handles.items():
            if handle.inline is not None:
                results[stage_id] = handle.inline.utility(method)
                continue
            call = asked.get(stage_id)
            if call is None:
                results[stage_id] = None
                continue
            call_id, future = call
            done = future.done() and not future.cancelled()
            results[stage_id] = future.result() if done else None
            self.channel.forget(call_id)
        return results
