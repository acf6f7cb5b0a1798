"""The ``vllm`` stage: text generation by upstream's ``AsyncLLM`` (GPU or CPU build).

Bridges a stage request to ``AsyncLLM.generate`` and turns what upstream
reports into what the stage worker normalizes (docs/runtime.md §12). It must
not catch exceptions to restyle them: classification is ``normalize``'s job.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any, ClassVar, NoReturn

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.errors import (
    GenerationError,
    GracefulHTTPError,
    OmniServiceUnavailableError,
    VLLMNotFoundError,
    VLLMValidationError,
    from_request_error,
    to_exception,
)
from vllm_omni.stages.base import Stage
from vllm_omni.stages.ranges import ParamRange
from vllm_omni.wire import hops
from vllm_omni.wire.messages import Payload, Submit

__all__ = ["ENGINE_ABORTED", "VLLMStage", "build_async_llm"]

EngineFactory = Callable[[dict[str, Any]], Any]
DEFAULT_MAX_TOKENS = 64
# What a client reads when the engine dropped its request unasked.
ENGINE_ABORTED = (
    "The engine aborted the request before it finished. Please try again later "
    "or on a different instance."
)


def build_async_llm(engine_args: dict[str, Any]) -> Any:
    """Upstream ``AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))``."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))


def _offline_sampling_params(params: Mapping[str, Any]) -> Any:
    """Upstream ``SamplingParams`` from an offline caller's ``params``: the
    whole object (``sampling_params``, msgspec JSON, as ``AsyncOmni`` sends
    it) or its keywords. msgspec checks each keyword's type (a 400 naming
    it), upstream's ``__post_init__`` its domain (``VLLMValidationError``
    with its own ``parameter``)."""
    import msgspec
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    encoded = params.get("sampling_params")
    keywords = {
        key: value
        for key, value in params.items()
        if key in SamplingParams.__struct_fields__
    }
    keywords.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    keywords.setdefault("temperature", 0.0)
    try:
        if isinstance(encoded, bytes):
            sampling = msgspec.json.decode(encoded, type=SamplingParams)
        else:
            sampling = msgspec.convert(keywords, SamplingParams, strict=True)
    except msgspec.ValidationError as exc:
        parameter = _path_parameter(str(exc)) or "sampling_params"
        raise VLLMValidationError(
            f"{parameter} has the wrong type", parameter=parameter
        ) from None
    if isinstance(encoded, bytes):
        sampling = _overridden(sampling, params)
    sampling.output_kind = RequestOutputKind.DELTA
    return sampling


def _overridden(sampling: Any, params: Mapping[str, Any]) -> Any:
    """``sampling`` with the ``SamplingParams`` keywords of ``params`` (a
    caller's per-stage entry, which wins over the request's own: docs/serving.md,
    "Per-stage sampling parameters"), verified again by upstream."""
    import msgspec

    overrides = {
        key: value
        for key, value in params.items()
        if key in sampling.__struct_fields__ and key != "output_kind"
    }
    if not overrides:
        return sampling
    kind = sampling.output_kind
    replaced = msgspec.structs.replace(sampling, **overrides)
    replaced.output_kind = kind
    return replaced


def _path_parameter(message: str) -> str | None:
    """The field a msgspec error names (``... - at `$.temperature```)."""
    marker = "at `$."
    at = message.rfind(marker)
    return message[at + len(marker) :].rstrip("`").split("[")[0] if at >= 0 else None


def _raise_error_response(response: Any) -> NoReturn:
    """Upstream's renderer answers some client mistakes with an
    ``ErrorResponse`` instead of raising: raise its semantic class."""
    error = response.error
    if error.code == HTTPStatus.BAD_REQUEST:
        raise VLLMValidationError(error.message, parameter=error.param)
    if error.code == HTTPStatus.NOT_FOUND:
        raise VLLMNotFoundError(error.message)
    raise GracefulHTTPError(error.message, HTTPStatus(error.code))


# Structured-output fields: a grammar the engine refuses was given in one.
_GRAMMAR_FIELDS = ("response_format", "structured_outputs")


def _name_parameter(exc: VLLMValidationError, fields: set[str]) -> None:
    """Name the request field an upstream ``VLLMValidationError`` is about
    when upstream did not (``top_k must be 0 (disable), or at least 1``; a
    grammar error of a ``response_format`` schema): its message starts with
    a field the client set, or it is the engine refusing a grammar."""
    if getattr(exc, "parameter", None) is not None or not exc.args:
        return
    message = str(exc.args[0])
    first = message.split(" ", 1)[0].strip("`:")
    if first in fields:
        exc.parameter = first
        return
    grammar = next((name for name in _GRAMMAR_FIELDS if name in fields), None)
    if grammar is not None and "grammar" in message.lower():
        exc.parameter = grammar


def _logprob_token(logprob: Any, token_id: int) -> str:
    return logprob.decoded_token if logprob.decoded_token is not None else ""


def _first(step: Mapping[int, Any], top: int) -> list[tuple[int, Any]]:
    """The first ``top`` (all for -1) of a step's logprobs, in the engine's
    order (sampled token first), as upstream's serving layer picks them."""
    items = list(step.items())
    return items if top == -1 else items[: max(top, 0)]


def _chat_logprobs(completion: Any, top: int) -> list[dict[str, Any]]:
    """Per-token logprobs of a delta in the chat shape, built with upstream's
    own response models."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionLogProb,
        ChatCompletionLogProbsContent,
    )

    entries = []
    for token_id, step in zip(completion.token_ids, completion.logprobs, strict=False):
        chosen = step[token_id]
        token = _logprob_token(chosen, token_id)
        entries.append(
            ChatCompletionLogProbsContent(
                token=token,
                logprob=max(chosen.logprob, -9999.0),
                bytes=list(token.encode("utf-8", errors="replace")),
                top_logprobs=[
                    ChatCompletionLogProb(
                        token=(text := _logprob_token(lp, tid)),
                        logprob=max(lp.logprob, -9999.0),
                        bytes=list(text.encode("utf-8", errors="replace")),
                    )
                    for tid, lp in _first(step, top)
                ],
            ).model_dump(exclude_none=True)
        )
    return entries


def _completion_logprobs(
    completion: Any, top: int, offset: int
) -> tuple[dict[str, Any], int]:
    """A delta's logprobs in the completions shape (four arrays, offsets
    counted from ``offset``), and the offset after it."""
    from vllm.entrypoints.openai.completion.protocol import CompletionLogProbs

    result = CompletionLogProbs()
    for token_id, step in zip(completion.token_ids, completion.logprobs, strict=False):
        chosen = step[token_id]
        token = _logprob_token(chosen, token_id)
        result.tokens.append(token)
        result.token_logprobs.append(max(chosen.logprob, -9999.0))
        result.text_offset.append(offset)
        offset += len(token)
        result.top_logprobs.append(
            {
                _logprob_token(lp, tid): max(lp.logprob, -9999.0)
                for tid, lp in _first(step, top)
            }
        )
    return result.model_dump(), offset


# The OpenAI request models of upstream that a route hands over (``openai``).
_REQUEST_MODELS = {
    "chat": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "completion": "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
}


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What one request hands to ``AsyncLLM.generate``, and how its logprobs
    are shaped (``api``: ``chat``, ``completion`` or ``None`` offline;
    ``top``: top logprobs per token, ``None`` when not asked for)."""

    prompt: Any
    sampling: Any
    api: str | None
    top: int | None
    priority: int
    # The fields the client set, to name the one an upstream error is about.
    fields: set[str] = field(default_factory=set)


class VLLMStage(Stage):
    """Streams ``AsyncLLM`` deltas as ``Payload(text=...)`` chunks."""

    kind: ClassVar[str] = "vllm"
    RANGES: ClassVar[Mapping[str, ParamRange] | None] = None
    ENGINE_METRICS: ClassVar[bool] = True

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Upstream's ``SamplingParams`` built from ``params`` (types by
        msgspec, domains by upstream), as ``generate`` builds it."""
        try:
            _offline_sampling_params(params)
        except VLLMValidationError as exc:
            _name_parameter(exc, set(params))
            raise

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
        # The engine's metrics name the model as clients do (``model_name``
        # label), not by its path, as ``vllm serve --served-model-name`` does.
        self._engine_args.setdefault("served_model_name", pipeline.model)
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
        self._renderer: Any = None
        self._sampling_defaults: dict[str, Any] | None = None

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

    def _online_renderer(self) -> Any:
        """Upstream's ``OnlineRenderer`` over this engine, built once: the
        renderer ``vllm serve`` puts in front of its chat and completion
        handlers (chat template, tokenization, prompt-length checks)."""
        if self._renderer is None:
            from vllm.renderers.online_renderer import OnlineRenderer

            self._renderer = OnlineRenderer(
                self._engine.model_config,
                self._engine.renderer,
                request_logger=None,
                chat_template=None,
                chat_template_content_format="auto",
            )
        return self._renderer

    def _default_sampling(self) -> dict[str, Any]:
        """The model's default sampling parameters, read once: upstream's
        serving classes read them at start-up (``default_sampling_params``);
        each read opens the model's ``generation_config.json`` (0.4 ms a
        request on the tiny model, issue 47's breakdown)."""
        if self._sampling_defaults is None:
            self._sampling_defaults = (
                self._engine.model_config.get_diff_sampling_param()
            )
        return self._sampling_defaults

    async def _openai_inputs(self, openai: Mapping[str, Any]) -> _Inputs:
        """Engine input and ``SamplingParams`` of an OpenAI request, exactly as
        upstream's serving layer makes them: its request model, its renderer,
        its ``get_max_tokens`` and ``to_sampling_params``."""
        api = openai.get("api")
        model_type = _REQUEST_MODELS.get(api) if isinstance(api, str) else None
        body = openai.get("request")
        if model_type is None or not isinstance(body, str):
            raise VLLMValidationError("malformed OpenAI request", parameter="openai")
        module, name = model_type.rsplit(":", 1)
        model = getattr(importlib.import_module(module), name)
        openai_request = model.model_validate_json(body)
        fields = set(openai_request.model_fields_set)
        try:
            return await self._render(api, openai_request, fields)
        except VLLMValidationError as exc:
            _name_parameter(exc, fields)
            raise

    async def _render(self, api: str, openai_request: Any, fields: set[str]) -> _Inputs:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

        renderer = self._online_renderer()
        if api == "chat":
            rendered = await renderer.render_chat(openai_request)
            if isinstance(rendered, ErrorResponse):
                _raise_error_response(rendered)
            engine_inputs = rendered[1]
            max_tokens = (
                openai_request.max_completion_tokens
                if openai_request.max_completion_tokens is not None
                else openai_request.max_tokens
            )
            top = openai_request.top_logprobs if openai_request.logprobs else None
        else:
            rendered = await renderer.render_completion(openai_request)
            if isinstance(rendered, ErrorResponse):
                _raise_error_response(rendered)
            engine_inputs = rendered
            max_tokens = openai_request.max_tokens
            top = openai_request.logprobs
        (engine_input,) = engine_inputs
        model_config = self._engine.model_config
        defaults = self._default_sampling()
        prompt_tokens = len(engine_input.get("prompt_token_ids") or ())
        sampling = openai_request.to_sampling_params(
            get_max_tokens(
                model_config.max_model_len,
                max_tokens,
                prompt_tokens,
                defaults,
                truncate_prompt_tokens=openai_request.truncate_prompt_tokens,
            ),
            defaults,
        )
        return _Inputs(
            engine_input, sampling, api, top, openai_request.priority, fields
        )

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        await self.start()
        lora = self._lora_for(request.params)
        openai = request.params.get("openai")
        if isinstance(openai, Mapping):
            inputs = await self._openai_inputs(openai)
            try:
                sampling = _overridden(inputs.sampling, request.params)
            except VLLMValidationError as exc:
                _name_parameter(exc, set(request.params))
                raise
            inputs = replace(inputs, sampling=sampling)
        else:
            try:
                sampling = _offline_sampling_params(request.params)
            except VLLMValidationError as exc:
                _name_parameter(exc, set(request.params))
                raise
            inputs = _Inputs(
                request.prompt,
                sampling,
                None,
                sampling.logprobs,
                0,
                set(request.params),
            )
        hops.mark(request.request_id, "engine.generate", self.config.id)
        stream = self._engine.generate(
            inputs.prompt,
            inputs.sampling,
            request.request_id,
            lora_request=lora,
            trace_headers=request.trace,
            priority=inputs.priority,
        )
        # Token counts for the response's usage: deltas carry their own ids.
        prompt_tokens = completion_tokens = 0
        offsets: dict[int, int] = {}
        # Closing the stream on cancel lets AsyncLLM abort the request itself.
        try:
            async for output in stream:
                hops.mark(request.request_id, "engine.output", self.config.id)
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
                for completion in output.outputs:
                    if completion.finish_reason == "error":
                        raise GenerationError("Internal server error")
                    if completion.finish_reason == "abort":
                        raise OmniServiceUnavailableError(
                            ENGINE_ABORTED, stage_id=self.config.id
                        )
                    completion_tokens += len(completion.token_ids or ())
                    finished = completion.finish_reason is not None
                    meta = (
                        {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                        }
                        if finished
                        else {}
                    )
                    logprobs = self._logprobs(inputs, completion, offsets)
                    if completion.text or finished or logprobs is not None:
                        yield Payload(
                            text=completion.text,
                            meta=meta,
                            index=completion.index,
                            finish_reason=completion.finish_reason,
                            logprobs=logprobs,
                        )
        except VLLMValidationError as exc:
            # The engine's input checks (a grammar it refuses, token ids
            # outside the vocabulary) run when it takes the request.
            _name_parameter(exc, inputs.fields)
            raise
        finally:
            await stream.aclose()

    @staticmethod
    def _logprobs(inputs: _Inputs, completion: Any, offsets: dict[int, int]) -> Any:
        """The delta's logprobs in the shape of the request's API (chat for
        offline callers), or ``None`` when none were asked for."""
        if inputs.top is None or not completion.logprobs:
            return None
        if inputs.api == "completion":
            logprobs, offsets[completion.index] = _completion_logprobs(
                completion, inputs.top, offsets.get(completion.index, 0)
            )
            return logprobs
        return _chat_logprobs(completion, inputs.top)

    def check_health(self) -> None:
        """Upstream's ``EngineDeadError`` once the engine's EngineCore died
        (``AsyncLLM.errored``): the stage's death, noticed with no request in
        flight."""
        engine = self._engine
        if engine is not None and getattr(engine, "errored", False):
            raise engine.dead_error

    def _parallel_config(self) -> Any:
        """The engine's ``ParallelConfig`` when it runs vLLM's fault tolerance
        (0.34's ``enable_fault_tolerance``), else ``None``."""
        vllm_config = getattr(self._engine, "vllm_config", None)
        config = getattr(vllm_config, "parallel_config", None)
        if not getattr(config, "enable_fault_tolerance", False):
            return None
        return config

    def fault_status(self) -> Mapping[str, Any] | None:
        """The status the engine client caches for its engine, as upstream's
        own admission reads it: 0.34's ``engine_core.engine_status``; 0.33
        keeps the same entry, without the property, in ``_engine_status`` by
        engine rank."""
        if self._parallel_config() is None:
            return None
        client = self._engine.engine_core
        status = getattr(client, "engine_status", None)
        if status is None:
            status = client._engine_status.get(client.engine_ranks_managed[0], {})
        return dict(status)

    def recovery_window_s(self) -> float | None:
        config = self._parallel_config()
        if config is None:
            return None
        return float(config.fault_tolerance_config.engine_recovery_timeout_sec)

    async def handle_fault(
        self, instruction: str, params: Mapping[str, Any], request_id: str
    ) -> Mapping[str, Any]:
        """``AsyncLLM.handle_fault`` with upstream's ``FaultToleranceRequest``
        (0.34's client refuses a second recovery while one runs; the engine
        refuses an instruction unless it is ``unhealthy``)."""
        if self._parallel_config() is None:
            return await super().handle_fault(instruction, params, request_id)
        import msgspec
        from vllm.v1.fault_tolerance.utils import FaultToleranceRequest

        result = await self._engine.handle_fault(
            FaultToleranceRequest(
                instruction=instruction, params=dict(params), request_id=request_id
            )
        )
        return msgspec.structs.asdict(result)

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
