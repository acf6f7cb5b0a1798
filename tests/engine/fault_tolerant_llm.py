"""A stand-in for vLLM 0.34's ``AsyncLLM`` with fault tolerance, and a ``vllm``
stage over it.

vLLM's fault tolerance cannot run on this machine (it needs external-LB data
parallelism on GPUs), so the drills use this engine. It has the surface the
``vllm`` stage reads, under 0.34's names, and behaves as 0.34's engine client
and EngineCore sentinel do (``vllm/v1/engine/core_client.py``,
``vllm/v1/fault_tolerance/engine_core_sentinel.py``):

- ``vllm_config.parallel_config.enable_fault_tolerance`` and its
  ``fault_tolerance_config.engine_recovery_timeout_sec``;
- ``engine_core.engine_status``: the cached status entry, replaced by each
  push: ``{"id": 0, "status": "healthy"}``; on a fault, every scheduled
  request ends with ``finish_reason "abort"`` and no error, then
  ``diagnosing``, then ``unhealthy`` with ``fault_info`` (the exception's
  class); after a successful recovery ``healthy`` again; with no recovery
  within the window, ``dead`` and the engine errored (``EngineDeadError``);
- ``handle_fault(FaultToleranceRequest)`` → ``FaultToleranceResult``: a
  second one while one runs is refused (``another recovery is in
  progress``), an instruction is refused unless the engine is
  ``unhealthy`` (``status is HEALTHY``); the cached entry carries
  ``ft_state`` (``recovering``, ``failed``), ``last_ft_request_id`` and
  ``ft_error`` as 0.34's client records them;
- admission: ``EngineFaultedError`` while the status is not ``healthy``.

On vLLM 0.33 (no ``EngineFaultedError``), its admission refuses with a 503
``EngineFaultedError`` of its own.

Prompt markers: ``@fault`` faults the engine (the request carrying it is
scheduled, so it is aborted too); ``@hang`` streams one delta, then waits
until the engine faults or the request is closed. The stage's
``engine_args`` set the timings: ``recovery_s`` (how long a ``retry``
takes), ``diagnose_s`` and ``window_s`` (the recovery window).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Mapping
from http import HTTPStatus
from typing import Any, ClassVar

import msgspec
import vllm.exceptions
from vllm.exceptions import GracefulHTTPError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.fault_tolerance.utils import FaultToleranceRequest, FaultToleranceResult

from tests.engine.async_llm_fake import AsyncLLMFake
from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.stages.vllm_backend import VLLMStage, _Inputs, _offline_sampling_params

__all__ = [
    "REPLY",
    "EngineFaultedError",
    "FaultTolerantLLM",
    "FaultTolerantVLLMStage",
]

REPLY = ("one", " two", " three")


def _faulted_error_class() -> type[GracefulHTTPError]:
    upstream = getattr(vllm.exceptions, "EngineFaultedError", None)
    if upstream is not None:
        return upstream  # type: ignore[no-any-return]

    class EngineFaultedError(GracefulHTTPError):
        """0.34's admission refusal, where the installed vLLM has none."""

        def __init__(self) -> None:
            super().__init__(
                "The engine has faulted and cannot accept new requests. "
                "Please try again later or on a different instance.",
                HTTPStatus.SERVICE_UNAVAILABLE,
            )

    return EngineFaultedError


EngineFaultedError = _faulted_error_class()


class _Client:
    """The engine client's cached status (0.34's ``AsyncMPClient``)."""

    def __init__(self) -> None:
        self._engine_status: dict[int, dict[str, Any]] = {
            0: {"id": 0, "status": "healthy"}
        }

    @property
    def engine_status(self) -> dict[str, Any]:
        return self._engine_status.get(0, {})

    def push(self, payload: dict[str, Any]) -> None:
        """A status push from the engine replaces the cached entry."""
        self._engine_status[0] = payload


class FaultTolerantLLM(AsyncLLMFake):
    """The engines built in this process, newest last (``built``)."""

    built: ClassVar[list[FaultTolerantLLM]] = []

    def __init__(self, engine_args: Mapping[str, Any]) -> None:
        super().__init__()
        self.recovery_s = float(engine_args.get("recovery_s", 0.5))
        self.diagnose_s = float(engine_args.get("diagnose_s", 0.1))
        window = int(engine_args.get("window_s", 30))
        self.vllm_config = types.SimpleNamespace(
            parallel_config=types.SimpleNamespace(
                enable_fault_tolerance=True,
                fault_tolerance_config=types.SimpleNamespace(
                    engine_recovery_timeout_sec=window
                ),
            )
        )
        self.engine_core = _Client()
        self.instructions: list[FaultToleranceRequest] = []
        self._fault = asyncio.Event()
        self._resumed: asyncio.Event | None = None
        self._dead = False
        self._tasks: set[asyncio.Task[None]] = set()
        FaultTolerantLLM.built.append(self)

    # -- 0.34's AsyncLLM surface ------------------------------------------------

    @property
    def errored(self) -> bool:
        return self._dead

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    @property
    def status(self) -> str:
        return str(self.engine_core.engine_status.get("status"))

    async def stream(
        self, prompt: str, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        if self._dead:
            raise EngineDeadError()
        if self.status != "healthy":
            raise EngineFaultedError()
        if "@fault" in prompt:
            self.fault()
        for index, text in enumerate(REPLY):
            if self._fault.is_set():
                yield self._output(request_id, prompt, "", "abort")
                return
            if index == 1 and "@hang" in prompt:
                await self._fault.wait()
                yield self._output(request_id, prompt, "", "abort")
                return
            last = index == len(REPLY) - 1
            yield self._output(request_id, prompt, text, "length" if last else None)
            await asyncio.sleep(0.01)

    async def handle_fault(
        self, ft_request: FaultToleranceRequest
    ) -> FaultToleranceResult:
        """0.34's client: one recovery at a time; the engine's sentinel:
        only while unhealthy."""
        self.instructions.append(ft_request)
        status = self.engine_core.engine_status
        if status.get("ft_state") == "recovering":
            return FaultToleranceResult(
                request_id=ft_request.request_id,
                success=False,
                reason="another recovery is in progress",
            )
        status["ft_state"] = "recovering"
        status["last_ft_request_id"] = ft_request.request_id
        status.pop("ft_error", None)
        result = await self._sentinel(ft_request)
        if not result.success:
            status = self.engine_core.engine_status
            status["ft_state"] = "failed"
            status["last_ft_request_id"] = result.request_id
            status["ft_error"] = result.reason
        return result

    async def get_status(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "total_engines": 1,
            "engines": [dict(self.engine_core.engine_status)],
        }

    def shutdown(self) -> None:
        super().shutdown()
        for task in self._tasks:
            task.cancel()

    # -- the EngineCore's side ---------------------------------------------------

    def fault(self) -> None:
        """The busy loop raised: abort what is scheduled, diagnose, wait."""
        if self._fault.is_set():
            return
        self._fault.set()
        self._resumed = asyncio.Event()
        self.engine_core.push({"id": 0, "status": "diagnosing"})
        task = asyncio.get_running_loop().create_task(self._wait_for_recovery())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_for_recovery(self) -> None:
        await asyncio.sleep(self.diagnose_s)
        self.engine_core.push(
            {"id": 0, "status": "unhealthy", "fault_info": "RuntimeError"}
        )
        assert self._resumed is not None
        window = self.vllm_config.parallel_config.fault_tolerance_config
        try:
            await asyncio.wait_for(
                self._resumed.wait(), window.engine_recovery_timeout_sec
            )
        except TimeoutError:
            self.engine_core.push({"id": 0, "status": "dead"})
            self._dead = True

    async def _sentinel(
        self, ft_request: FaultToleranceRequest
    ) -> FaultToleranceResult:
        status = self.status
        if ft_request.instruction not in ("retry", "scale_down"):
            reason = (
                f"[FT] Rejecting unknown instruction '{ft_request.instruction}' "
                "on engine 0"
            )
        elif status != "unhealthy":
            reason = (
                f"[FT] Rejecting {ft_request.instruction} on engine 0: "
                f"status is {status.upper()}"
            )
        else:
            await asyncio.sleep(self.recovery_s)
            self._fault.clear()
            assert self._resumed is not None
            self._resumed.set()
            self.engine_core.push({"id": 0, "status": "healthy"})
            return FaultToleranceResult(request_id=ft_request.request_id, success=True)
        return FaultToleranceResult(
            request_id=ft_request.request_id, success=False, reason=reason
        )

    @staticmethod
    def _output(
        request_id: str, prompt: str, text: str, reason: str | None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=[1, 2],
            prompt_logprobs=None,
            outputs=[
                CompletionOutput(
                    index=0,
                    text=text,
                    token_ids=[3] if text else [],
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason=reason,
                )
            ],
            finished=reason is not None,
        )


class FaultTolerantVLLMStage(VLLMStage):
    """Upstream's bridge (``VLLMStage``) over ``FaultTolerantLLM``; an OpenAI
    request's prompt is its last message's text (the stand-in has no
    tokenizer to render a chat template with)."""

    def __init__(self, config: StageConfig, pipeline: PipelineConfig) -> None:
        super().__init__(config, pipeline, engine_factory=FaultTolerantLLM)

    async def _openai_inputs(self, openai: Mapping[str, Any]) -> _Inputs:
        body = msgspec.json.decode(openai["request"])
        if openai["api"] == "chat":
            prompt = str(body["messages"][-1]["content"])
        else:
            prompt = str(body["prompt"])
        sampling = _offline_sampling_params({"max_tokens": 16})
        return _Inputs(prompt, sampling, None, None, 0, set(body))
