"""The ``vllm`` stage: text generation by upstream's ``AsyncLLM`` (GPU or CPU build).

Owns the bridge from a stage request to ``AsyncLLM.generate`` and the
translation of what upstream reports into what the stage worker normalizes:

- ``EngineDeadError`` propagates as is: ``normalize`` marks it fatal, the
  worker sends ``fatal=True`` and exits, the engine is dead;
- ``EngineGenerateError`` propagates as is: a nonfatal server error of this
  request only (``OmniEngineGenerateError`` on the orchestrator side);
- ``VLLMValidationError`` (and every other ``VLLMClientError``) propagates
  as is: a client error that keeps its ``parameter``;
- a client's LoRA adapter (``params["lora"]``, a name from
  ``options.lora_modules``) that the stage does not know is a
  ``VLLMNotFoundError`` (404) raised here, before the engine sees it: on the
  real engine an adapter path that does not exist raises in the EngineCore's
  worker and kills the engine (every later request gets ``EngineDeadError``),
  so a client's typo must never become a path. Known adapters are loaded with
  ``add_lora`` on ``start``, so a bad configured path fails the stage start,
  not a request. Without ``enable_lora`` any adapter is a 400 (parameter
  ``lora``) raised here: upstream's own 400 prints the ``LoRARequest``;
- sampling values go to upstream's ``SamplingParams`` unchanged (after a
  type check), so upstream's own validation decides, with its ``parameter``;
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

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine.messages import Payload, Submit
from vllm_omni.errors import (
    GenerationError,
    VLLMNotFoundError,
    VLLMValidationError,
    from_request_error,
    to_exception,
)
from vllm_omni.stages.base import Stage

__all__ = ["VLLMStage", "build_async_llm"]

EngineFactory = Callable[[dict[str, Any]], Any]
DEFAULT_MAX_TOKENS = 64


def build_async_llm(engine_args: dict[str, Any]) -> Any:
    """Upstream ``AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))``."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))


def _number(params: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``params[name]`` if absent or of ``kind`` (bool excluded), else a 400."""
    value = params.get(name)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise VLLMValidationError(f"{name} has the wrong type", parameter=name)


def _flag(params: Mapping[str, Any], name: str) -> bool:
    """``params[name]`` as a bool (absent: ``False``), else a 400."""
    value = params.get(name, False)
    if isinstance(value, bool):
        return value
    raise VLLMValidationError(f"{name} has the wrong type", parameter=name)


def _sampling_params(params: Mapping[str, Any]) -> Any:
    """Upstream ``SamplingParams``: upstream validates the values and names the
    offending ``parameter`` (``VLLMValidationError``)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    max_tokens = _number(params, "max_tokens", int)
    temperature = _number(params, "temperature", (int, float))
    return SamplingParams(
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=0.0 if temperature is None else float(temperature),
        seed=_number(params, "seed", int),
        # vLLM's extension: generate max_tokens whatever the model's EOS.
        ignore_eos=_flag(params, "ignore_eos"),
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
        modules = config.options.get("lora_modules", {})
        if not isinstance(modules, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v
            for k, v in modules.items()
        ):
            raise VLLMValidationError(
                "lora_modules maps adapter names to paths",
                parameter=f"stages[{config.id}].options.lora_modules",
            )
        # Adapter ids are fixed by name order, so they are stable across restarts.
        self._lora_modules: dict[str, tuple[int, str]] = {
            name: (index, modules[name])
            for index, name in enumerate(sorted(modules), start=1)
        }
        self._lora_enabled = bool(self._engine_args.get("enable_lora"))
        self._engine_factory = engine_factory
        self._engine: Any = None

    async def start(self) -> None:
        if self._engine is None:
            self._engine = self._engine_factory(self._engine_args)
            if self._lora_enabled:
                for name in self._lora_modules:
                    await self._engine.add_lora(self._lora_request(name))

    def _lora_request(self, name: str) -> Any:
        from vllm.lora.request import LoRARequest

        lora_id, path = self._lora_modules[name]
        return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)

    def _lora_for(self, params: Mapping[str, Any]) -> Any:
        """The ``LoRARequest`` for ``params["lora"]``, or a client error."""
        name = params.get("lora")
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise VLLMValidationError("lora must be an adapter name", parameter="lora")
        if not self._lora_enabled:
            # Upstream rejects this too (400), but its message prints the
            # whole LoRARequest, configured path included: answer here.
            raise VLLMValidationError(
                "LoRA is not enabled for this model", parameter="lora"
            )
        if name not in self._lora_modules:
            # Never a path the engine would try to load: that kills the engine.
            raise VLLMNotFoundError("The LoRA adapter does not exist.")
        return self._lora_request(name)

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        await self.start()
        sampling = _sampling_params(request.params)
        lora = self._lora_for(request.params)
        stream = self._engine.generate(
            request.prompt, sampling, request.request_id, lora_request=lora
        )
        # Token counts for the response's usage: deltas carry their own ids.
        prompt_tokens = completion_tokens = 0
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
                if output.prompt_token_ids:
                    prompt_tokens = len(output.prompt_token_ids)
                for completion in output.outputs[:1]:
                    if completion.finish_reason == "error":
                        raise GenerationError("Internal server error")
                    completion_tokens += len(completion.token_ids or ())
                    meta = (
                        {
                            "finish_reason": completion.finish_reason,
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                        }
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
