"""The ``vllm`` stage: text generation by upstream vLLM's ``AsyncLLM`` (GPU).

Owns the bridge from a stage request to ``AsyncLLM.generate`` and the
translation of what upstream reports into what the stage worker normalizes:

- ``EngineDeadError`` propagates as is: ``normalize`` marks it fatal, the
  worker sends ``fatal=True`` and exits, the engine is dead;
- ``EngineGenerateError`` propagates as is: a nonfatal server error of this
  request only (``OmniEngineGenerateError`` on the orchestrator side);
- ``VLLMValidationError`` (and every other ``VLLMClientError``) propagates
  as is: a client error that keeps its ``parameter``;
- a ``RequestError`` on an output (``output.error``, as 0.33 exposes it on
  pooling outputs) becomes a record through ``from_request_error`` and is
  raised as the matching remote exception; an ``"error"`` finish reason is a
  ``GenerationError``, as upstream's serving layer treats it.

The engine is built lazily from ``options.engine_args`` (``AsyncEngineArgs``
keyword arguments) on ``start``; tests inject a fake through
``engine_factory``. This module must not catch exceptions to restyle them:
classification is ``normalize``'s job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine.messages import Payload, Submit
from vllm_omni.errors import (
    GenerationError,
    VLLMValidationError,
    from_request_error,
    to_exception,
)
from vllm_omni.stages.base import Stage
from vllm_omni.stages.text import TextParams

__all__ = ["VLLMStage", "build_async_llm"]

EngineFactory = Callable[[dict[str, Any]], Any]


def build_async_llm(engine_args: dict[str, Any]) -> Any:
    """Upstream ``AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))``."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))


def _sampling_params(params: TextParams) -> Any:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        seed=params.seed,
        output_kind=RequestOutputKind.DELTA,
    )


class VLLMStage(Stage):
    """Streams ``AsyncLLM`` deltas as ``Payload(text=...)`` chunks."""

    kind: ClassVar[str] = "vllm"

    def __init__(
        self,
        config: StageConfig,
        pipeline: PipelineConfig,
        *,
        engine_factory: EngineFactory = build_async_llm,
    ) -> None:
        super().__init__(config, pipeline)
        engine_args = config.options.get("engine_args", {})
        if not isinstance(engine_args, dict) or not engine_args.get("model"):
            raise VLLMValidationError(
                "a vllm stage needs options.engine_args with a model",
                parameter=f"stages[{config.id}].options.engine_args",
            )
        self._engine_args = dict(engine_args)
        self._engine_factory = engine_factory
        self._engine: Any = None

    async def start(self) -> None:
        if self._engine is None:
            self._engine = self._engine_factory(self._engine_args)

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        await self.start()
        params = TextParams.from_params(request.params)
        sampling = _sampling_params(params)
        stream = self._engine.generate(request.prompt, sampling, request.request_id)
        # Closing the stream on cancel lets AsyncLLM abort the request itself.
        try:
            async for output in stream:
                error = getattr(output, "error", None)
                if error is not None:
                    raise to_exception(
                        from_request_error(
                            error,
                            request_id=request.request_id,
                            stage_id=self.config.id,
                        )
                    )
                for completion in output.outputs[:1]:
                    if completion.finish_reason == "error":
                        raise GenerationError("Internal server error")
                    meta = (
                        {"finish_reason": completion.finish_reason}
                        if completion.finish_reason
                        else {}
                    )
                    if completion.text or meta:
                        yield Payload(text=completion.text, meta=meta)
        finally:
            await stream.aclose()

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
