"""The ``vllm`` stage backend against a fake ``AsyncLLM`` raising upstream's classes.

Each case runs the stage as the stage worker does: iterate ``generate``,
``normalize`` what it raises with the request and stage ids, then rebuild the
exception the orchestrator would (``to_exception``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from vllm.exceptions import GenerationError, VLLMValidationError
from vllm.outputs import (
    CompletionOutput,
    PoolingRequestOutput,
    RequestError,
    RequestOutput,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from tests.engine.async_llm_fake import AsyncLLMFake
from vllm_omni.config import StageConfig, pipeline_from_mapping
from vllm_omni.errors import (
    OmniClientError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniServerError,
    normalize,
    to_exception,
)
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.render import should_retry
from vllm_omni.stages.vllm_backend import ENGINE_ABORTED, VLLMStage
from vllm_omni.wire.messages import Payload, Submit

STAGE_ID = 4
ENGINE_ARGS = {"model": "facebook/opt-125m"}


def completion(text: str, finish_reason: str | None = None) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt="p",
        prompt_token_ids=[1],
        prompt_logprobs=None,
        outputs=[
            CompletionOutput(
                index=0,
                text=text,
                token_ids=[2],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason=finish_reason,
            )
        ],
        finished=finish_reason is not None,
    )


def failed_output(error: RequestError) -> PoolingRequestOutput[Any]:
    return PoolingRequestOutput(
        request_id="r",
        outputs=None,
        prompt_token_ids=[1],
        num_cached_tokens=0,
        finished=True,
        error=error,
    )


class FakeAsyncLLM(AsyncLLMFake):
    """Yields scripted outputs; an exception in the script is raised there."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__()
        self.script = script
        self.added_loras: list[Any] = []

    async def add_lora(self, lora_request: Any) -> bool:
        self.added_loras.append(lora_request)
        return True

    async def stream(self, prompt: Any, request_id: str) -> AsyncIterator[Any]:
        for step in self.script:
            if isinstance(step, BaseException):
                raise step
            yield step


def make_stage(
    script: list[Any],
    engine_args: Any = ENGINE_ARGS,
    lora_modules: dict[str, str] | None = None,
) -> tuple[VLLMStage, list]:
    built: list[FakeAsyncLLM] = []

    def factory(args: dict[str, Any]) -> FakeAsyncLLM:
        # The engine serves (and labels its metrics with) the pipeline's name.
        assert args == {"served_model_name": "m", **engine_args}
        built.append(FakeAsyncLLM(script))
        return built[0]

    options: dict[str, Any] = {"engine_args": engine_args}
    if lora_modules is not None:
        options["lora_modules"] = lora_modules
    config = StageConfig(STAGE_ID, "gpu", "vllm", options=options)
    pipeline = pipeline_from_mapping(
        {"model": "m", "stages": [{"id": STAGE_ID, "kind": "vllm"}]}
    )
    return VLLMStage(config, pipeline, engine_factory=factory), built


async def run_like_the_worker(
    stage: VLLMStage, params: dict[str, Any] | None = None
) -> tuple[list[Payload], OmniErrorDetails | None]:
    chunks: list[Payload] = []
    try:
        request = Submit(request_id="req-7", prompt="hello", params=params or {})
        async for chunk in stage.generate(request):
            chunks.append(chunk)
    except Exception as exc:
        return chunks, normalize(exc, request_id="req-7", stage_id=STAGE_ID)
    return chunks, None


async def test_streams_deltas_and_builds_the_engine_lazily() -> None:
    stage, built = make_stage([completion("Hel"), completion("lo", "stop")])
    assert not built
    await stage.start()
    chunks, error = await run_like_the_worker(stage, {"max_tokens": 5, "seed": 1})
    assert error is None
    assert [c.text for c in chunks] == ["Hel", "lo"]
    # The last chunk carries its finish reason and the engine's token counts.
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].meta == {"prompt_tokens": 1, "completion_tokens": 2}
    sampling = built[0].sampling_params
    assert (sampling.max_tokens, sampling.seed) == (5, 1)
    await stage.shutdown()
    assert built[0].was_shut_down


@pytest.mark.parametrize(
    ("raised", "status", "error_type", "fatal", "rebuilt"),
    [
        (
            EngineGenerateError(),
            500,
            "InternalServerError",
            False,
            OmniEngineGenerateError,
        ),
        (EngineDeadError(), 500, "InternalServerError", True, OmniEngineDeadError),
        (
            GenerationError("boom"),
            500,
            "InternalServerError",
            False,
            OmniEngineGenerateError,
        ),
    ],
    ids=["generate-error", "dead", "generation-error"],
)
async def test_engine_errors(
    raised: BaseException, status: int, error_type: str, fatal: bool, rebuilt: type
) -> None:
    stage, _ = make_stage([completion("partial"), raised])
    chunks, details = await run_like_the_worker(stage)
    assert [c.text for c in chunks] == ["partial"]
    assert details is not None
    assert (details.category, details.status_code, details.error_type) == (
        "server",
        status,
        error_type,
    )
    assert details.fatal is fatal and details.stage_id == STAGE_ID
    assert details.request_id == "req-7"
    exc = to_exception(details)
    assert type(exc) is rebuilt and exc.stage_id == STAGE_ID  # type: ignore[attr-defined]


async def test_validation_error_is_a_client_400_with_parameter() -> None:
    raised = VLLMValidationError(
        "max_tokens too large", parameter="max_tokens", value=10**9
    )
    stage, _ = make_stage([raised])
    _, details = await run_like_the_worker(stage)
    assert details is not None
    assert (details.category, details.status_code, details.parameter) == (
        "client",
        400,
        "max_tokens",
    )
    assert str(10**9) not in details.message
    assert isinstance(to_exception(details), OmniClientError)


async def test_upstream_sampling_validation_before_the_engine() -> None:
    stage, built = make_stage([completion("never")])
    _, details = await run_like_the_worker(stage, {"temperature": -1})
    assert details is not None
    assert (details.status_code, details.parameter) == (400, "temperature")
    assert "-1" not in details.message
    assert built and built[0].sampling_params is None


async def test_a_sampling_value_of_the_wrong_type_is_a_400() -> None:
    stage, built = make_stage([completion("never")])
    _, details = await run_like_the_worker(stage, {"max_tokens": "many"})
    assert details is not None
    assert (details.status_code, details.parameter) == (400, "max_tokens")
    assert built and built[0].sampling_params is None


@pytest.mark.parametrize(
    ("params", "expected"), [({}, False), ({"ignore_eos": True}, True)]
)
async def test_ignore_eos_reaches_the_sampling_params(
    params: dict[str, Any], expected: bool
) -> None:
    stage, built = make_stage([completion("x", "length")])
    _, details = await run_like_the_worker(stage, params)
    assert details is None
    assert built[0].sampling_params.ignore_eos is expected


@pytest.mark.parametrize("value", ["yes", 1, None])
async def test_ignore_eos_that_is_not_a_bool_is_a_400(value: object) -> None:
    stage, built = make_stage([completion("never")])
    _, details = await run_like_the_worker(stage, {"ignore_eos": value})
    assert details is not None
    assert (details.status_code, details.parameter) == (400, "ignore_eos")
    assert built and built[0].sampling_params is None


LORA_ARGS = {"model": "facebook/opt-125m", "enable_lora": True}


async def test_known_adapters_are_loaded_on_start_and_used_by_name() -> None:
    stage, built = make_stage(
        [completion("ok", "stop")],
        engine_args=LORA_ARGS,
        lora_modules={"sql": "/adapters/sql", "chat": "/adapters/chat"},
    )
    await stage.start()
    assert [
        (r.lora_name, r.lora_int_id, r.lora_path) for r in built[0].added_loras
    ] == [
        ("chat", 1, "/adapters/chat"),
        ("sql", 2, "/adapters/sql"),
    ]
    chunks, details = await run_like_the_worker(stage, {"lora": "sql"})
    assert details is None and [c.text for c in chunks] == ["ok"]
    (used,) = built[0].lora_requests
    assert (used.lora_name, used.lora_int_id, used.lora_path) == (
        "sql",
        2,
        "/adapters/sql",
    )


@pytest.mark.parametrize("name", ["missing", "/tmp/adapter", "../sql"])
async def test_an_unknown_adapter_is_a_404_that_never_reaches_the_engine(
    name: str,
) -> None:
    stage, built = make_stage(
        [completion("never")],
        engine_args=LORA_ARGS,
        lora_modules={"sql": "/adapters/sql"},
    )
    _, details = await run_like_the_worker(stage, {"lora": name})
    assert details is not None
    assert (details.category, details.status_code, details.error_type) == (
        "client",
        404,
        "NotFoundError",
    )
    assert name not in details.message and not details.fatal
    assert built[0].lora_requests == []


async def test_without_enable_lora_any_adapter_is_a_400_before_the_engine() -> None:
    stage, built = make_stage(
        [completion("never")], lora_modules={"sql": "/adapters/sql"}
    )
    _, details = await run_like_the_worker(stage, {"lora": "sql"})
    assert details is not None
    assert (details.status_code, details.parameter) == (400, "lora")
    assert "/adapters" not in details.message
    assert built[0].lora_requests == [] and built[0].added_loras == []


@pytest.mark.parametrize("value", [3, "", ["sql"]])
async def test_a_lora_that_is_not_a_name_is_a_400(value: object) -> None:
    stage, built = make_stage(
        [completion("never")], engine_args=LORA_ARGS, lora_modules={}
    )
    _, details = await run_like_the_worker(stage, {"lora": value})
    assert details is not None
    assert (details.status_code, details.parameter) == (400, "lora")
    assert built[0].lora_requests == []


def test_lora_modules_must_map_names_to_paths() -> None:
    with pytest.raises(VLLMValidationError) as info:
        make_stage([], lora_modules={"sql": 3})  # type: ignore[dict-item]
    assert info.value.parameter == f"stages[{STAGE_ID}].options.lora_modules"


@pytest.mark.parametrize(
    ("error", "category", "status", "error_type"),
    [
        (
            RequestError("validation_error", "prompt too long"),
            "client",
            400,
            "BadRequestError",
        ),
        (
            RequestError("busy", "try later", retryable=True),
            "server",
            503,
            "ServiceUnavailableError",
        ),
        (
            RequestError("internal", "kernel failed"),
            "server",
            500,
            "InternalServerError",
        ),
    ],
    ids=["validation", "retryable", "generation"],
)
async def test_request_error_on_an_output(
    error: RequestError, category: str, status: int, error_type: str
) -> None:
    stage, _ = make_stage([failed_output(error)])
    _, details = await run_like_the_worker(stage)
    assert details is not None
    assert (details.category, details.status_code, details.error_type) == (
        category,
        status,
        error_type,
    )
    assert details.stage_id == STAGE_ID and details.request_id == "req-7"
    rebuilt = to_exception(details)
    assert isinstance(
        rebuilt,
        OmniClientError
        if category == "client"
        else (OmniServerError, OmniEngineGenerateError),
    )


async def test_error_finish_reason_is_a_generation_error() -> None:
    stage, _ = make_stage([completion("x", "error")])
    _, details = await run_like_the_worker(stage)
    assert details is not None and details.status_code == 500 and not details.fatal


@pytest.mark.parametrize(
    ("finish_reason", "outcome"),
    [
        ("stop", None),
        ("length", None),
        ("abort", (503, "ServiceUnavailableError", True)),
        ("error", (500, "InternalServerError", True)),
    ],
)
async def test_only_a_real_finish_is_a_success(
    finish_reason: str, outcome: tuple[int, str, bool] | None
) -> None:
    """An abort the server did not ask for (the server's own close the
    stream, see below) truncated the answer: a retryable 503 naming the
    stage, not a finish the next stage would take as the whole answer."""
    stage, _ = make_stage([completion("half an"), completion(" ans", finish_reason)])
    chunks, details = await run_like_the_worker(stage)
    if outcome is None:
        assert details is None and chunks[-1].finish_reason == finish_reason
        return
    assert details is not None
    assert (details.status_code, details.error_type, details.category) == (
        *outcome[:2],
        "server",
    )
    assert should_retry(details) is outcome[2]
    assert details.stage_id == STAGE_ID
    assert [c.finish_reason for c in chunks] == [None]
    if finish_reason == "abort":
        assert details.message == ENGINE_ABORTED


async def test_cancelling_closes_the_upstream_stream() -> None:
    stage, built = make_stage(
        [completion("a"), completion("b"), completion("c", "stop")]
    )
    stream = stage.generate(Submit(request_id="req-8", prompt="p"))
    assert (await anext(stream)).text == "a"
    await stream.aclose()
    assert built[0].closed


async def test_an_explicit_served_model_name_is_kept() -> None:
    args = {**ENGINE_ARGS, "served_model_name": "team-model"}
    stage, built = make_stage([completion("x", "stop")], engine_args=args)
    await stage.start()
    assert len(built) == 1  # the factory saw served_model_name "team-model"


def test_engine_args_need_a_model() -> None:
    with pytest.raises(VLLMValidationError) as info:
        make_stage([], engine_args={})
    assert info.value.parameter == f"stages[{STAGE_ID}].options.engine_args"


async def test_upstream_sampling_params_travel_whole() -> None:
    import msgspec
    from vllm.sampling_params import SamplingParams

    given = SamplingParams(n=2, temperature=0.7, top_p=0.5, stop=["x"], logprobs=2)
    stage, built = make_stage([completion("x", "stop")])
    _, details = await run_like_the_worker(
        stage, {"sampling_params": msgspec.json.encode(given)}
    )
    assert details is None
    sampling = built[0].sampling_params
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.stop) == (
        2,
        0.7,
        0.5,
        ["x"],
    )
    assert sampling.logprobs == 2


async def test_every_sampling_params_keyword_is_read() -> None:
    stage, built = make_stage([completion("x", "stop")])
    params = {
        "temperature": 1.0,
        "top_k": 5,
        "min_p": 0.1,
        "presence_penalty": 1.0,
        "stop": ["y"],
    }
    _, details = await run_like_the_worker(stage, params)
    assert details is None
    sampling = built[0].sampling_params
    assert (sampling.top_k, sampling.min_p, sampling.presence_penalty) == (5, 0.1, 1.0)
    assert sampling.stop == ["y"]


async def test_choices_stream_with_their_index_and_finish_reason() -> None:
    two = RequestOutput(
        request_id="r",
        prompt="p",
        prompt_token_ids=[1, 2],
        prompt_logprobs=None,
        outputs=[
            CompletionOutput(
                index=1,
                text="b",
                token_ids=[3],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason="stop",
            ),
            CompletionOutput(
                index=0,
                text="a",
                token_ids=[4, 5],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason="length",
            ),
        ],
        finished=True,
    )
    stage, _ = make_stage([two])
    chunks, details = await run_like_the_worker(stage, {"n": 2, "temperature": 1.0})
    assert details is None
    assert [(c.index, c.text, c.finish_reason) for c in chunks] == [
        (1, "b", "stop"),
        (0, "a", "length"),
    ]
    assert chunks[-1].meta == {"prompt_tokens": 2, "completion_tokens": 3}


async def test_upstreams_unnamed_errors_name_the_key() -> None:
    stage, built = make_stage([completion("never")])
    _, details = await run_like_the_worker(stage, {"n": 2})  # greedy by default
    assert details is not None
    assert (details.status_code, details.parameter) == (400, "n")
    assert built[0].sampling_params is None


class _FaultTolerantClient:
    """0.34's engine client: the status cached per rank, the property."""

    def __init__(self) -> None:
        self.engine_ranks_managed = [0]
        self._engine_status = {0: {"id": 0, "status": "unhealthy"}}

    @property
    def engine_status(self) -> dict[str, Any]:
        return self._engine_status[0]


class _Client033:
    """0.33's engine client: the same cache, without the property."""

    def __init__(self) -> None:
        self.engine_ranks_managed = [3]
        self._engine_status = {3: {"id": 3, "status": "healthy"}}


def _with_fault_tolerance(engine: Any, client: Any, enabled: bool = True) -> None:
    from types import SimpleNamespace

    engine.vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(
            enable_fault_tolerance=enabled,
            fault_tolerance_config=SimpleNamespace(engine_recovery_timeout_sec=45),
        )
    )
    engine.engine_core = client


async def test_the_engines_fault_tolerance_status_as_its_client_caches_it() -> None:
    """The status upstream's own admission reads (0.34's property, 0.33's
    cache), the recovery window; ``None`` without fault tolerance."""
    stage, built = make_stage([])
    await stage.start()
    assert stage.fault_status() is None and stage.recovery_window_s() is None
    _with_fault_tolerance(built[0], _FaultTolerantClient(), enabled=False)
    assert stage.fault_status() is None
    _with_fault_tolerance(built[0], _FaultTolerantClient())
    assert stage.fault_status() == {"id": 0, "status": "unhealthy"}
    assert stage.recovery_window_s() == 45.0
    _with_fault_tolerance(built[0], _Client033())
    assert stage.fault_status() == {"id": 3, "status": "healthy"}


async def test_a_recovery_goes_through_the_engines_handle_fault() -> None:
    from vllm.v1.fault_tolerance.utils import (
        FaultToleranceRequest,
        FaultToleranceResult,
    )

    stage, built = make_stage([])
    await stage.start()
    refused = await stage.handle_fault("retry", {}, "r-0")
    assert refused["success"] is False  # no fault tolerance: nothing to ask
    sent: list[FaultToleranceRequest] = []

    async def handle_fault(request: FaultToleranceRequest) -> FaultToleranceResult:
        sent.append(request)
        return FaultToleranceResult(request.request_id, True)

    _with_fault_tolerance(built[0], _FaultTolerantClient())
    built[0].handle_fault = handle_fault
    result = await stage.handle_fault("retry", {"k": 1}, "r-1")
    assert result == {"request_id": "r-1", "success": True, "reason": None}
    assert [(r.instruction, r.params, r.request_id) for r in sent] == [
        ("retry", {"k": 1}, "r-1")
    ]


async def test_the_models_default_sampling_is_read_once() -> None:
    """Each read of the model's defaults opens ``generation_config.json``
    (``get_diff_sampling_param``); upstream's serving classes read them once
    at start-up, and so does the stage (issue 47: 0.47 ms a request)."""
    stage, built = make_stage([])
    await stage.start()
    reads: list[int] = []

    class ModelConfig:
        def get_diff_sampling_param(self) -> dict[str, Any]:
            reads.append(1)
            return {"temperature": 0.6}

    built[0].model_config = ModelConfig()  # type: ignore[attr-defined]
    first = stage._default_sampling()
    assert stage._default_sampling() is first
    assert first == {"temperature": 0.6}
    assert reads == [1]
