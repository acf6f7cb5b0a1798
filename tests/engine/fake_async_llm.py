"""A ``vllm`` stage over a fake ``AsyncLLM``, for a stage in the engine's process.

Only a stage in the orchestrator's process can be given a fake engine this
way: the test points ``STAGE_KINDS["vllm"]`` at ``FakeVLLMStage``, which is
upstream's bridge (``VLLMStage``, every line of it) over ``FakeAsyncLLM``.
The fake does what the real engine's front end does where the contract
meets it (the main environment's vLLM has no engine that runs on a CPU; the
real one is in ``tests/real_engine``):

- while it is built it registers ``vllm:`` metrics on the default registry,
  a gauge and a counter labelled as upstream labels them; on its first
  request, a histogram (as vLLM 0.34 registers
  ``vllm:request_render_duration_seconds`` on its first render);
- ``generate`` streams a few deltas; a prompt with ``@hang`` waits until
  the request is closed (an abort: the stream is closed, as ``AsyncLLM``
  aborts a request whose stream closes), ``@reject`` raises upstream's
  ``VLLMValidationError`` with its parameter, ``@die`` kills the engine
  (``EngineDeadError`` here and in every request it holds), ``@dropped``
  streams one delta then ends with finish reason ``"abort"`` and no error
  (``@stall``: one delta, then waits as ``@hang`` does)
  (what vLLM 0.34's fault tolerance does to the requests of an engine that
  faults), ``@faulted`` refuses at admission with vLLM 0.34's
  ``EngineFaultedError`` (where the installed vLLM defines it);
- ``errored``/``dead_error`` as ``AsyncLLM`` has them, set by ``die()``
  (its EngineCore gone, with or without a request in flight).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import vllm.exceptions
from prometheus_client import Counter, Gauge, Histogram
from vllm.exceptions import VLLMValidationError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.engine.exceptions import EngineDeadError

from tests.engine.async_llm_fake import AsyncLLMFake
from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.stages.vllm_backend import VLLMStage

__all__ = ["REPLY", "FakeAsyncLLM", "FakeVLLMStage"]

REPLY = ("one", " two", " three")
_LABELS = ["model_name", "engine"]


class FakeAsyncLLM(AsyncLLMFake):
    """The engines built in this process, newest last (``built``)."""

    built: ClassVar[list[FakeAsyncLLM]] = []

    def __init__(self, engine_args: dict[str, Any]) -> None:
        super().__init__()
        self.model = engine_args["served_model_name"]
        self.running = Gauge(
            "vllm:num_requests_running", "Running requests.", _LABELS
        ).labels(self.model, "0")
        self.success = Counter(
            "vllm:request_success", "Finished requests.", _LABELS
        ).labels(self.model, "0")
        # vLLM 0.34 registers its render histogram on the first render.
        self.render_duration: Any = None
        self._dead = asyncio.Event()
        # The task each request's stream ran in, by request id.
        self.tasks: dict[str, asyncio.Task[Any] | None] = {}
        FakeAsyncLLM.built.append(self)

    @property
    def errored(self) -> bool:
        return self._dead.is_set()

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    def die(self) -> None:
        """The EngineCore is gone: every request it holds fails."""
        self._dead.set()

    async def stream(
        self, prompt: str, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        self.tasks[request_id] = asyncio.current_task()
        if self.errored:
            raise EngineDeadError()
        if self.render_duration is None:
            self.render_duration = Histogram(
                "vllm:request_render_duration_seconds",
                "Time spent rendering a request.",
                ["model_name", "request_type"],
            )
        self.render_duration.labels(self.model, "chat").observe(0.001)
        if "@faulted" in prompt:
            raise vllm.exceptions.EngineFaultedError()  # type: ignore[attr-defined]
        if "@reject" in prompt:
            raise VLLMValidationError(
                "top_k must be at least 1", parameter="top_k", value=0
            )
        self.running.inc()
        try:
            if "@die" in prompt:
                self.die()
            if "@hang" in prompt or "@die" in prompt:
                await self._dead.wait()
                raise EngineDeadError()
            dropped = "@dropped" in prompt
            for index, text in enumerate(REPLY[:2] if dropped else REPLY):
                await asyncio.sleep(0)
                if index == 1 and "@stall" in prompt:
                    await self._dead.wait()
                    raise EngineDeadError()
                last = index == (1 if dropped else len(REPLY) - 1)
                reason = ("abort" if dropped else "length") if last else None
                yield RequestOutput(
                    request_id=request_id,
                    prompt=prompt,
                    prompt_token_ids=[1, 2],
                    prompt_logprobs=None,
                    outputs=[
                        CompletionOutput(
                            index=0,
                            text=text,
                            token_ids=[index + 3],
                            cumulative_logprob=None,
                            logprobs=None,
                            finish_reason=reason,
                        )
                    ],
                    finished=last,
                )
            self.success.inc()
        finally:
            self.running.dec()


class FakeVLLMStage(VLLMStage):
    """Upstream's bridge over ``FakeAsyncLLM``."""

    def __init__(self, config: StageConfig, pipeline: PipelineConfig) -> None:
        super().__init__(config, pipeline, engine_factory=FakeAsyncLLM)
