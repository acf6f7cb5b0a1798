"""An API server process's side: ``EngineClient`` stands where ``AsyncOmni``
stands with one process, ``JobsClient`` where the job store stands.

They answer what the routes ask with the same values and the same
exceptions: what the pipeline offers comes once, at ``connect``; a
request's outputs and its exception come from the engine process as
``AsyncOmni`` made them; admission before the body reads the engine's count
from the shared ``AdmissionBoard``. Calls that ``AsyncOmni`` answers at once
but that need the engine here (``check_faulted``, the fault-tolerance
status) return awaitables; the routes await them (``serving_common.resolved``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncGenerator, Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import zmq

from vllm_omni.engine.loop_socket import LoopSocket
from vllm_omni.engine.request_table import (
    AdmissionHolds,
    refuse_over_limit,
    release_held_place,
)
from vllm_omni.entrypoints.engine_rpc.board import AdmissionBoard
from vllm_omni.entrypoints.engine_rpc.protocol import (
    EngineInfo,
    dumps,
    loads,
    open_socket,
)
from vllm_omni.errors import OmniEngineDeadError, OmniServiceUnavailableError
from vllm_omni.errors.metrics import AbortReason, abort_context

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from vllm_omni.config import PipelineConfig, StageConfig
    from vllm_omni.entrypoints.openai.jobs import Job
    from vllm_omni.outputs import OmniRequestOutput

__all__ = ["EngineClient", "JobsClient"]

logger = logging.getLogger("vllm_omni.engine_rpc")


class EngineClient:
    """``AsyncOmni``'s surface, served by the engine process at ``address``."""

    def __init__(self, address: str, board: AdmissionBoard, index: int = 0) -> None:
        self.address = address
        self._board = board
        # Places held for requests this process's routes let through early,
        # on the board (every process counts them) until they reach the
        # engine.
        self._holds = AdmissionHolds(functools.partial(board.hold, index))
        self._context = zmq.Context()
        self._socket = LoopSocket(
            open_socket(self._context, zmq.DEALER), self._on_frames
        )
        self._info: EngineInfo | None = None
        self._hello: asyncio.Future[EngineInfo] | None = None
        self._streams: dict[int, asyncio.Queue[tuple[str, Any]]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._dead: BaseException | None = None
        self._closed = False
        self.video_jobs = JobsClient(self)

    async def connect(self, timeout_s: float) -> None:
        """Reach the engine process and learn its pipeline; it answers once
        its engine runs (``OmniServiceUnavailableError`` after ``timeout_s``)."""
        self._socket.socket.connect(self.address)
        self._socket.start(asyncio.get_running_loop())
        self._hello = asyncio.get_running_loop().create_future()
        self._post(("hello",))
        try:
            self._info = await asyncio.wait_for(self._hello, timeout_s)
        except TimeoutError:
            raise OmniServiceUnavailableError(
                f"The engine process did not answer in {timeout_s:g} s."
            ) from None

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            raise OmniServiceUnavailableError("The engine process is not reached yet.")
        return self._info

    # -- the wire --------------------------------------------------------------

    def _post(self, message: tuple[Any, ...]) -> None:
        if self._closed:
            raise OmniServiceUnavailableError("The engine client is shut down.")
        self._socket.send(dumps(message))

    def _on_frames(self, frames: list[bytes]) -> None:
        message = loads(frames[-1])
        kind = message[0]
        if kind in ("output", "end", "error"):
            queue = self._streams.get(message[1])
            if queue is not None:
                queue.put_nowait((kind, message[2] if len(message) > 2 else None))
        elif kind == "result":
            future = self._calls.pop(message[1], None)
            if future is not None and not future.done():
                if message[2]:
                    future.set_result(message[3])
                else:
                    future.set_exception(message[3])
        elif kind == "hello":
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(message[1])
        elif kind == "dead":
            if self._dead is None:
                # The engine process logged the death (CRITICAL, once).
                logger.warning("engine dead: %s", message[1])
            self._dead = message[1]

    async def _call(self, target: str, method: str, **kwargs: Any) -> Any:
        call_id = next(self._ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        self._post(("call", call_id, target, method, kwargs))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    # -- what the pipeline offers ---------------------------------------------

    @property
    def config(self) -> PipelineConfig:
        return self.info.config

    @property
    def model_name(self) -> str:
        return self.info.config.model

    @property
    def modalities(self) -> frozenset[str]:
        return self.info.modalities

    def stage_for(self, modality: str) -> StageConfig | None:
        return self.info.stages_for.get(modality)

    @property
    def voices(self) -> list[str]:
        return self.info.voices

    @property
    def max_num_queued_reqs(self) -> int:
        return self.info.max_num_queued_reqs

    # -- requests --------------------------------------------------------------

    async def generate(
        self,
        prompt: str,
        sampling_params: Any = None,
        request_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        """``AsyncOmni.generate`` in the engine process: the same outputs,
        the same exceptions; closing this generator early aborts the request
        there, with the transport's abort reason."""
        key = next(self._ids)
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._streams[key] = queue
        release_held_place()  # the engine counts it from now on
        self._post(("generate", key, (prompt, sampling_params, request_id), kwargs))
        ended = False
        try:
            while True:
                kind, value = await queue.get()
                if kind == "output":
                    yield value
                elif kind == "end":
                    ended = True
                    return
                else:
                    ended = True
                    raise value
        finally:
            self._streams.pop(key, None)
            if not ended and not self._closed:
                context = abort_context()
                reason = None if context is None else context.reason
                if context is not None:
                    context.counted = True  # the engine counts it, with reason
                self._post(("close", key, reason))

    async def abort(
        self, request_id: str | Iterable[str], *, reason: AbortReason = "abort"
    ) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._post(("abort", ids, reason))

    def check_admission(self, request_id: str) -> None:
        """``AsyncOmni.check_admission`` against the engine's count."""
        refuse_over_limit(request_id, self._board.get(), self.max_num_queued_reqs)

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """``AsyncOmni.hold_admission``: the place is held on the board."""
        self.check_admission(request_id)
        return self._holds.hold()

    # -- health ----------------------------------------------------------------

    @property
    def errored(self) -> bool:
        return self._dead is not None

    @property
    def is_running(self) -> bool:
        return self._info is not None and not self._closed and self._dead is None

    @property
    def dead_error(self) -> BaseException:
        return self._dead or OmniEngineDeadError()

    @property
    def should_keep_api_server_alive(self) -> bool:
        return False

    async def check_health(self) -> None:
        if self._dead is not None:
            raise self._dead

    def check_faulted(self) -> Awaitable[None]:
        return self._call("engine", "check_faulted")

    def fault_tolerance_status(self) -> Awaitable[list[dict[str, Any]]]:
        return self._call("engine", "fault_tolerance_status")

    def apply_fault_instruction(
        self,
        stage_id: int,
        instruction: str,
        params: Mapping[str, Any],
        request_id: str,
    ) -> Awaitable[None]:
        return self._call(
            "engine",
            "apply_fault_instruction",
            stage_id=stage_id,
            instruction=instruction,
            params=dict(params),
            request_id=request_id,
        )

    async def stage_stats(self) -> dict[int, dict[str, Any] | None]:
        stats: dict[int, dict[str, Any] | None] = await self._call(
            "engine", "stage_stats"
        )
        return stats

    async def stage_pids(self) -> dict[int, int | None]:
        pids: dict[int, int | None] = await self._call("engine", "stage_pids")
        return pids

    async def stage_families(self) -> list[Metric]:
        """The stages' ``vllm:`` families, labelled, as the engine's
        ``/metrics`` would show them."""
        families: list[Metric] = await self._call("metrics", "stage_families")
        return families

    def shutdown(self) -> None:
        """Stop talking to the engine (which the engine process shuts down);
        requests still reading here end with a 503."""
        if self._closed:
            return
        self._closed = True
        error = OmniServiceUnavailableError("The API server is shutting down.")
        for queue in self._streams.values():
            queue.put_nowait(("error", error))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._socket.close()
        self._context.term()


class JobsClient:
    """``VideoJobs``' surface for the routes; the jobs run in the engine
    process, whichever API server process created them, so any process reads,
    lists, cancels and deletes any job, and one process sweeps them."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    @property
    def retention_s(self) -> int | None:
        return self._engine.info.retention_s

    def api(self, job: Job) -> dict[str, Any]:
        return job.to_api(self.retention_s)

    async def submit(
        self,
        *,
        prompt: str,
        params: dict[str, Any],
        seconds: str | None,
        size: str | None,
    ) -> Job:
        job: Job = await self._engine._call(
            "jobs", "submit", prompt=prompt, params=params, seconds=seconds, size=size
        )
        return job

    async def get(self, job_id: str) -> Job | None:
        job: Job | None = await self._engine._call("jobs", "get", job_id=job_id)
        return job

    async def list(
        self, *, limit: int, after: str | None, newest_first: bool
    ) -> tuple[list[Job], bool] | None:
        page: tuple[list[Job], bool] | None = await self._engine._call(
            "jobs", "list", limit=limit, after=after, newest_first=newest_first
        )
        return page

    async def content(self, job_id: str) -> bytes | None:
        data: bytes | None = await self._engine._call("jobs", "content", job_id=job_id)
        return data

    async def cancel(self, job_id: str) -> bool:
        done: bool = await self._engine._call("jobs", "cancel", job_id=job_id)
        return done

    async def delete(self, job_id: str) -> bool:
        done: bool = await self._engine._call("jobs", "delete", job_id=job_id)
        return done

    async def shutdown(self) -> None:
        """Nothing to stop here: the engine process owns the jobs."""
