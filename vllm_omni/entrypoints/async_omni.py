"""``AsyncOmni``: the asyncio engine client, in the style of vLLM's ``AsyncLLM``.

Owns the engine's lifecycle and the request API the server and ``Omni`` use;
the ``Orchestrator`` moves the requests (docs/runtime.md §14). It must not
classify or render errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from vllm_omni.config import (
    PipelineConfig,
    PipelineConfigError,
    StageConfig,
    WorkerBackend,
    liveness_settings,
    load_pipeline,
    pipeline_for_model,
    with_traces_endpoint,
)
from vllm_omni.engine.orchestrator import Orchestrator
from vllm_omni.engine.request_table import DEFAULT_MAX_NUM_QUEUED_REQS
from vllm_omni.engine.stage_channel import Transport
from vllm_omni.engine.stage_handle import StageLauncher
from vllm_omni.entrypoints.sampling_params_list import per_stage_params
from vllm_omni.errors import (
    OmniEngineDeadError,
    VLLMValidationError,
    for_caller,
    raise_for_caller,
)
from vllm_omni.errors.metrics import AbortReason
from vllm_omni.outputs import OmniRequestOutput
from vllm_omni.tracing.hooks import request_span
from vllm_omni.tracing.provider import configure as configure_tracing
from vllm_omni.tracing.provider import resolve_endpoint

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

__all__ = ["AsyncOmni"]

_T = TypeVar("_T")


class AsyncOmni:
    """An engine client for a multi-stage pipeline.

    Args:
        pipeline: ``"reference"`` (built in, the default without a
            ``model``), a YAML file path, or a loaded ``PipelineConfig``.
        model: as vllm-omni callers write ``AsyncOmni(model=...)``: a model
            (name or path) served by one ``vllm`` stage, in this process
            (``vllm_omni.config.pipeline_for_model``); with a ``pipeline``,
            the model of its one ``vllm`` stage.
        **engine_args: upstream ``AsyncEngineArgs`` keywords for that
            ``vllm`` stage (``max_model_len=128``); a name that is not one,
            or a pipeline with no ``vllm`` stage to give it to, is a
            ``VLLMValidationError`` naming it.
        transport: ``"ipc"`` (a socket in a private temp dir) or ``"tcp"``
            (needed when some stages run on other hosts); default: ``tcp``
            when the pipeline has an ``orchestrator_address``, else ``ipc``.
        host, port: where to bind for ``tcp`` (port 0: any free port);
            default: the pipeline's ``orchestrator_address``, else
            127.0.0.1 and any port.
        startup_timeout_s: how long ``start`` waits for every stage.
        heartbeat_timeout_s: silence after which a stage on another host
            (``remote``, or a Ray actor) is dead; default: the pipeline's,
            10 s (local stages are watched through their process, every
            100 ms).
        silence_timeout_s: silence after which such a stage is *silent*:
            the requests in flight there fail with 504, the ones that need
            it are refused with 503 until it is heard again; default: the
            pipeline's, 3 s (none when the heartbeat timeout is not above
            it). Between the 1 s heartbeat interval and
            ``heartbeat_timeout_s``.
        worker_backend: ``"multi_process"`` (local stage processes) or
            ``"ray"`` (one Ray actor per stage); default: the pipeline's
            ``worker_backend``, else ``multi_process``.
        ray_address: the Ray cluster to join (default: the pipeline's
            ``ray_address``; none: a local instance on 127.0.0.1, started
            and stopped with the engine).
        stage_init_timeout_s: how long a Ray stage may wait for placement
            and actor start (default: the pipeline's, 120 s).
        ray_probe_interval_s, ray_probe_timeout_s: how often the Ray backend
            pings each stage actor and the GCS, and how long it waits for
            an answer (default: the pipeline's ``ray:`` keys, 1 s and 2 s).
            A stage that misses it fails its in-flight requests with 504 and
            refuses new ones with 503; an unreachable GCS refuses new
            requests with 503. The timeout must stay below
            ``heartbeat_timeout_s``, after which a silent stage is dead.
        max_num_queued_reqs: requests in flight before admission refuses
            with ``QueueOverflowError`` (upstream's ``--max-num-queued-reqs``).
        otlp_traces_endpoint: export OpenTelemetry traces over OTLP there
            (vLLM's ``--otlp-traces-endpoint``; default: the standard
            ``OTEL_EXPORTER_OTLP_*`` environment, else no tracing): this
            process, every stage process and every ``vllm`` stage's engine
            (docs/observability/tracing.md).
    """

    def __init__(
        self,
        pipeline: str | os.PathLike[str] | PipelineConfig | None = None,
        *,
        model: str | None = None,
        transport: Transport | None = None,
        host: str | None = None,
        port: int | None = None,
        startup_timeout_s: float = 120.0,
        heartbeat_timeout_s: float | None = None,
        silence_timeout_s: float | None = None,
        worker_backend: WorkerBackend | None = None,
        ray_address: str | None = None,
        stage_init_timeout_s: float | None = None,
        ray_probe_interval_s: float | None = None,
        ray_probe_timeout_s: float | None = None,
        max_num_queued_reqs: int = DEFAULT_MAX_NUM_QUEUED_REQS,
        otlp_traces_endpoint: str | None = None,
        **engine_args: Any,
    ) -> None:
        self._finalizer: weakref.finalize | None = None
        try:
            endpoint = resolve_endpoint(otlp_traces_endpoint)
            self.config = with_traces_endpoint(
                _pipeline(pipeline, model, engine_args), endpoint
            )
            configure_tracing(endpoint, process="engine")
        except Exception as exc:
            raise_for_caller(exc)
        self.worker_backend = _backend(worker_backend or self.config.worker_backend)
        heartbeat_timeout_s, silence = _liveness(
            self.config, heartbeat_timeout_s, silence_timeout_s
        )
        launcher: StageLauncher | None = None
        if self.worker_backend == "ray":
            from vllm_omni.engine.ray_backend import RayStageLauncher

            interval, timeout = _probe_settings(
                self.config,
                ray_probe_interval_s,
                ray_probe_timeout_s,
                heartbeat_timeout_s,
            )
            launcher = RayStageLauncher(
                address=ray_address or self.config.ray_address,
                stage_init_timeout_s=stage_init_timeout_s
                or self.config.stage_init_timeout_s,
                probe_interval_s=interval,
                probe_timeout_s=timeout,
                # By then the orchestrator has declared the stage dead, even
                # when a healed link came back one way first (TCP's
                # retransmission backoff can delay the other direction about
                # as long as the cut lasted).
                orchestrator_timeout_s=2 * heartbeat_timeout_s,
            )
        listen = self.config.orchestrator_address
        self._orchestrator = Orchestrator(
            self.config,
            transport=transport or ("tcp" if listen else "ipc"),
            host=host or (listen[0] if listen else "127.0.0.1"),
            port=port if port is not None else (listen[1] if listen else 0),
            startup_timeout_s=startup_timeout_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            silence_timeout_s=silence,
            launcher=launcher,
            max_num_queued_reqs=max_num_queued_reqs,
        )

    @classmethod
    async def create(
        cls,
        pipeline: str | os.PathLike[str] | PipelineConfig | None = None,
        **kwargs: Any,
    ) -> AsyncOmni:
        """Construct and start an engine; see the class for the arguments."""
        engine = cls(pipeline, **kwargs)
        await engine.start()
        return engine

    async def start(self) -> None:
        """Start the stage processes and wait until all are ready.

        Raises ``StageStartupError`` (an ``OmniServiceUnavailableError`` with
        ``stage_id``) naming the stage and its exception class and first line
        if a stage fails to start, and ``OmniServiceUnavailableError`` if the
        stages are not ready in time.
        """
        # Registered before the stages start: a half-started engine that is
        # dropped must not leave processes behind either.
        self._finalizer = weakref.finalize(
            self, _shutdown_soon, asyncio.get_running_loop(), self._orchestrator
        )
        try:
            await self._orchestrator.start()
        except Exception as exc:
            raise_for_caller(exc)

    async def __aenter__(self) -> AsyncOmni:
        if not self.is_running:
            await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.shutdown()

    # -- what the pipeline offers ---------------------------------------------

    @property
    def model_name(self) -> str:
        return self.config.model

    @property
    def modalities(self) -> frozenset[str]:
        """The output modalities this pipeline can produce."""
        return self._orchestrator.modalities

    def stage_for(self, modality: str) -> StageConfig | None:
        """The stage that does a modality's main work (``text``: the text or
        ``vllm`` stage; ``audio``: the talker; ``image``, ``video``), the one
        whose kind decides which request fields are honoured; ``None`` when
        the pipeline has none."""
        return self._orchestrator.stage_for(modality)

    @property
    def voices(self) -> list[str]:
        """Voice names the talker accepts (empty without a speech route)."""
        if "audio" not in self.modalities:
            return []
        from vllm_omni.stages.speech import VOICES

        return sorted(VOICES)

    @property
    def address(self) -> str:
        """The orchestrator's ZMQ address (stages on other hosts connect here)."""
        return self._orchestrator.address

    # -- requests --------------------------------------------------------------

    async def generate(
        self,
        prompt: str,
        sampling_params: Mapping[str, Any] | SamplingParams | None = None,
        request_id: str | None = None,
        *,
        modalities: Iterable[str] | str | None = None,
        params: Mapping[str, Any] | SamplingParams | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: Iterable[str] | str | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        """Run one request; yields outputs, the last with ``finished=True``.

        Called as vllm-omni 0.30 (and vLLM's ``AsyncLLM``) is,
        ``generate(prompt, sampling_params, request_id, output_modalities=...)``,
        or with today's keywords: ``sampling_params`` is ``params`` (on a
        one-stage ``AsyncOmni(model=...)`` pipeline, 0.30's stage-0 entry),
        ``output_modalities`` is ``modalities`` (default ``["text"]``); giving
        both names of one argument is a ``VLLMValidationError`` naming the
        0.30 one.

        ``trace_headers`` (as 0.30's and ``AsyncLLM.generate``'s): the W3C
        ``traceparent``/``tracestate`` the request's trace continues; every
        stage's span, and a ``vllm`` stage's engine span, join it. With
        tracing on and no traced request calling, the request gets a root
        span of its own, ``generate``, with the record of its failure.

        ``sampling_params_list`` (vllm-omni's per-stage list): entry *i* is a
        mapping of stage *i*'s parameters or upstream's ``SamplingParams``
        (``None``: the stage's defaults); for its stage it wins over
        ``params`` key by key. Each entry is checked before anything runs
        (``VLLMValidationError``, ``parameter`` e.g.
        ``sampling_params_list.1.max_tokens``); an entry for a stage this
        request does not go through is checked and has no effect.

        Text streams one output per token (``text_delta``, with the choice
        ``index`` when ``n`` > 1); audio, images and video arrive in the final
        output. ``params`` maps the parameters the request's stages read
        (``vllm_omni.stages.STAGE_PARAMS``; a ``vllm`` stage reads every
        keyword of upstream's ``SamplingParams``), or is upstream's
        ``SamplingParams`` itself for a pipeline whose text stage is a
        ``vllm`` stage, as ``vllm.LLM.generate`` callers pass it. A key that
        no stage on the route reads is refused, never dropped. Raises:

        - ``OmniEngineDeadError`` (an ``EngineDeadError``) when the engine is
          dead, before or during the request;
        - ``VLLMValidationError`` (before submission) for bad modalities,
          prompt, params or ``request_id`` types; ``OmniServiceUnavailableError``
          (503) when the pipeline has no stage for a modality or the engine
          is shut down; ``OmniConflictError`` (409) when ``request_id`` is
          already in flight;
        - the semantic class a stage raised, rebuilt from its record when a
          stage rejected the request (``VLLMValidationError`` 400,
          ``VLLMNotFoundError`` 404 for an unknown voice,
          ``VLLMUnprocessableEntityError`` 422, ``GuardrailViolationError``);
          each is also an ``OmniClientError`` for one release;
        - ``OmniEngineGenerateError`` (``stage_id``) for a nonfatal stage
          failure, the semantic 501/503/504 class or ``OmniServerError`` for
          other server errors a stage raised;
        - ``OmniStageTimeoutError`` (504, ``stage_id``) when a stage misses
          its deadline, or a stage on another host (remote, or a Ray actor)
          falls silent while the request is there (no heartbeat for
          ``silence_timeout_s``, or its Ray probe unanswered); the request
          is aborted in every stage;
        - ``OmniServiceUnavailableError`` (503, ``stage_id``, retryable) when
          a stage the request needs is silent, or, on the Ray backend, the
          cluster's GCS does not answer (the ``stage_id`` of the request's
          first stage);
        - a faulted record (503, ``stage_id``, retryable, ``Retry-After`` the
          rest of the recovery window; vLLM 0.34's ``EngineFaultedError``
          where it is defined) when a stage the request needs has an engine
          that faulted and has not recovered yet; a request at that stage
          when it faulted fails with ``OmniServiceUnavailableError`` (503,
          ``stage_id``).

        Every exception carries ``.details``, the record the server would
        render (with this ``request_id``), and survives ``pickle``.
        """
        if request_id is None:
            request_id = f"omni-{uuid.uuid4().hex}"
        span = request_span(str(request_id), trace_headers)
        try:
            if not isinstance(request_id, str) or not request_id:
                raise VLLMValidationError(
                    "request_id must be a non-empty string", parameter="request_id"
                )
            params = _one_of("params", params, "sampling_params", sampling_params)
            modalities = _one_of(
                "modalities", modalities, "output_modalities", output_modalities
            )
            stream = self._orchestrator.generate(
                prompt,
                request_id=request_id,
                modalities=parse_modalities(
                    ("text",) if modalities is None else modalities
                ),
                params=_plain_params(params),
                stage_params=per_stage_params(self.config.stages, sampling_params_list),
                trace_headers=span.headers(None) or trace_headers,
            )
            # aclosing: closing this generator aborts the request at once.
            async with contextlib.aclosing(stream) as outputs:
                async for output in outputs:
                    yield output
        except Exception as exc:
            error = for_caller(
                exc, request_id=request_id if isinstance(request_id, str) else None
            )
            span.fail(error.details)  # type: ignore[attr-defined]
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            span.abort()
            raise
        span.finish()

    async def abort(
        self, request_id: str | Iterable[str], *, reason: AbortReason = "abort"
    ) -> None:
        """Abort requests in every stage; their streams end with
        ``finish_reason="abort"``. Unknown ids are ignored. ``reason`` labels
        ``vllm_omni:aborts_total``."""
        ids = (request_id,) if isinstance(request_id, str) else request_id
        for one in ids:
            self._orchestrator.abort(one, reason=reason)

    def check_admission(self, request_id: str) -> None:
        """Raise upstream's ``QueueOverflowError`` (503) now if ``generate``
        would refuse ``request_id`` at admission (the engine holds
        ``max_num_queued_reqs`` requests): a server asks before it reads a
        request's body, so an overloaded engine refuses at once. ``generate``
        still decides; a request this lets through may be refused there."""
        self._orchestrator.check_admission(request_id)

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """``check_admission``, then a place held for ``request_id`` until
        ``generate`` admits it or the context ends: an HTTP route that passed
        the check lets the requests that came with it be refused first,
        while its own place counts against the limit."""
        return self._orchestrator.hold_admission(request_id)

    def watch_in_flight(self, listener: Callable[[int], None] | None) -> None:
        """Tell ``listener`` how many requests are in flight now and whenever
        that changes (an API server process in front of this engine reads it
        for its early admission check); ``None`` stops telling."""
        self._orchestrator.requests.count_listener = listener
        if listener is not None:
            listener(len(self._orchestrator.requests))

    @property
    def max_num_queued_reqs(self) -> int:
        """The engine-wide admission limit (``--max-num-queued-reqs``)."""
        return self._orchestrator.max_num_queued_reqs

    # -- health ----------------------------------------------------------------

    @property
    def errored(self) -> bool:
        """True once a stage died or reported a fatal error."""
        return self._orchestrator.dead_error is not None

    @property
    def is_running(self) -> bool:
        return self._orchestrator.is_running

    @property
    def dead_error(self) -> BaseException:
        """The error that killed the engine (a fresh ``OmniEngineDeadError``
        if it is not dead, as upstream's ``dead_error`` does)."""
        return self._orchestrator.dead_error or OmniEngineDeadError()

    @property
    def should_keep_api_server_alive(self) -> bool:
        return False

    async def check_health(self) -> None:
        """Raise the dead error when the engine is dead; otherwise return."""
        if self.errored:
            raise self.dead_error

    def faulted_stages(self) -> list[StageConfig]:
        """The stages whose engine is faulted now (vLLM 0.34's fault
        tolerance: ``diagnosing`` or ``unhealthy``); requests that need one
        are refused with a retryable 503 until it recovers."""
        return self._orchestrator.faulted_stages()

    def check_faulted(self) -> None:
        """Raise the refusal of the first stage whose engine is faulted (the
        faulted 503 a request for it gets, naming it); return while none is."""
        try:
            self._orchestrator.check_faulted()
        except Exception as exc:
            raise_for_caller(exc)

    def fault_tolerance_status(self) -> list[dict[str, Any]]:
        """Each stage's status (``healthy``, ``silent``, ``diagnosing``,
        ``unhealthy``, ``dead``) and, for a stage whose engine runs fault
        tolerance, its engine's own status entry (vLLM 0.34's shape), its
        recovery window, how long it has been faulted and its recoveries."""
        return self._orchestrator.fault_tolerance_status()

    def apply_fault_instruction(
        self,
        stage_id: int,
        instruction: str,
        params: Mapping[str, Any],
        request_id: str,
    ) -> None:
        """Start a fault-tolerance instruction (``retry``, ``scale_down``) at
        a stage's engine, as vLLM 0.34's ``/v1/fault_tolerance/apply`` does;
        its result shows in ``fault_tolerance_status``. One recovery at a
        time per stage: ``OmniConflictError`` (409) while one runs or while
        the engine is not waiting for one; ``VLLMValidationError`` (400) for
        an unknown instruction or a stage without fault tolerance. The server
        starts a ``retry`` by itself as soon as a stage's engine is
        ``unhealthy``."""
        try:
            self._orchestrator.apply_fault_instruction(
                stage_id, instruction, params, request_id
            )
        except Exception as exc:
            raise_for_caller(exc)

    async def stage_stats(self) -> dict[int, dict[str, Any] | None]:
        """What each stage saw, asked from the stage processes themselves.

        Per stage id: ``submitted``/``completed``/``failed`` counts, ``active``
        request ids, recent ``aborts`` (every abort received) and
        ``cancelled`` (aborts that stopped running work), ``pid`` (this
        process's for a stage that runs in it),
        ``compact_errors`` (the orchestrator welcomed 0.31 records); ``None``
        for a stage that cannot answer (e.g. it died).
        """
        return await self._orchestrator.call_utility("stats")

    def stage_pids(self) -> dict[int, int | None]:
        """Process id of each stage (``None`` until it is ready, and for a
        stage that runs in this process: ``vllm_omni.engine.inline``)."""
        return self._orchestrator.stage_pids()

    def shutdown(self) -> None:
        """Stop every stage process and release sockets; idempotent.

        Call it from the engine's event-loop thread. In-flight requests fail
        with ``OmniServiceUnavailableError`` (503).
        """
        if self._finalizer is not None:
            self._finalizer.detach()
        self._orchestrator.shutdown()


def _pipeline(
    pipeline: str | os.PathLike[str] | PipelineConfig | None,
    model: str | None,
    engine_args: dict[str, Any],
) -> PipelineConfig:
    """The pipeline a caller's arguments name: the file or the reference
    pipeline, or a model's one ``vllm`` stage (with its engine arguments)."""
    if pipeline is None and model is None:
        pipeline = "reference"
    if isinstance(model, str) and model.startswith(("/", "./", "../", "~")):
        if not os.path.exists(os.path.expanduser(model)):
            # A local path is the caller's to get right; a hub name is the
            # stage's to resolve when it starts.
            raise VLLMValidationError(
                "model is a path that does not exist", parameter="model"
            )
    base = load_pipeline(pipeline) if pipeline is not None else None
    if base is not None and model is None and not engine_args:
        return base
    config = pipeline_for_model(model, engine_args, base=base)
    _check_engine_args(engine_args)
    return config


def _check_engine_args(engine_args: Mapping[str, Any]) -> None:
    """Each name an upstream ``AsyncEngineArgs`` field, or a
    ``VLLMValidationError`` naming it (the stage would fail to start)."""
    if not engine_args:
        return
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    unknown = next((name for name in engine_args if name not in known), None)
    if unknown is not None:
        raise VLLMValidationError(
            f"{unknown} is not an engine argument (vLLM's AsyncEngineArgs)",
            parameter=unknown,
        )


def _probe_settings(
    config: PipelineConfig,
    interval_s: float | None,
    timeout_s: float | None,
    heartbeat_timeout_s: float,
) -> tuple[float, float]:
    """The Ray probe's interval and timeout: the arguments, else the
    pipeline's; a bad one raises ``VLLMValidationError`` naming where it
    came from (``ray_probe_timeout_s`` or the YAML's ``ray.probe_timeout_s``)."""
    chosen: dict[str, tuple[float, str]] = {}
    for name, given, default in (
        ("interval_s", interval_s, config.ray_probe_interval_s),
        ("timeout_s", timeout_s, config.ray_probe_timeout_s),
    ):
        if given is None:
            chosen[name] = (default, f"ray.probe_{name}")
            continue
        if isinstance(given, bool) or not isinstance(given, int | float) or given <= 0:
            raise VLLMValidationError(
                f"ray_probe_{name} must be a positive number",
                parameter=f"ray_probe_{name}",
            )
        chosen[name] = (float(given), f"ray_probe_{name}")
    timeout, where = chosen["timeout_s"]
    if timeout >= heartbeat_timeout_s:
        # The heartbeat would mark the stage dead before its probe noticed.
        raise VLLMValidationError(
            f"{where} must be below heartbeat_timeout_s ({heartbeat_timeout_s:g} s)",
            parameter=where,
        )
    return chosen["interval_s"][0], timeout


def _liveness(
    config: PipelineConfig, heartbeat_timeout_s: object, silence_timeout_s: object
) -> tuple[float, float | None]:
    """The heartbeat and silence timeouts: the arguments, else the pipeline's;
    a bad one raises ``VLLMValidationError`` naming it."""
    try:
        if heartbeat_timeout_s is None:
            heartbeat_timeout_s = config.heartbeat_timeout_s
        if silence_timeout_s is None:
            silence_timeout_s = config.silence_timeout_s
        return liveness_settings(heartbeat_timeout_s, silence_timeout_s)
    except PipelineConfigError as exc:
        raise VLLMValidationError(exc.message, parameter=exc.parameter) from None


def _backend(name: str) -> WorkerBackend:
    if name not in get_args(WorkerBackend):
        raise VLLMValidationError(
            f"worker_backend must be one of {', '.join(get_args(WorkerBackend))}",
            parameter="worker_backend",
        )
    return name  # type: ignore[return-value]


def parse_modalities(modalities: object) -> tuple[str, ...]:
    """``generate``'s ``modalities`` as a tuple of names (checked by the route)."""
    if isinstance(modalities, str):
        return (modalities,)
    if isinstance(modalities, Iterable) and not isinstance(modalities, Mapping):
        wanted = tuple(modalities)
        if all(isinstance(modality, str) for modality in wanted):
            return wanted
    raise VLLMValidationError(
        "modalities must be a modality name or a list of them",
        parameter="modalities",
    )


def _one_of(name: str, value: _T | None, alias: str, aliased: _T | None) -> _T | None:
    """The argument given under today's ``name`` or vllm-omni's ``alias``;
    both is a ``VLLMValidationError`` naming the alias."""
    if value is not None and aliased is not None:
        raise VLLMValidationError(
            f"{alias} is {name} under vllm-omni 0.30's name: give one of them",
            parameter=alias,
        )
    return aliased if value is None else value


def _shutdown_soon(loop: asyncio.AbstractEventLoop, orchestrator: Orchestrator) -> None:
    """Finalizer of a dropped engine: shut it down on its own loop (the garbage
    collector may run in any thread); the loop is gone, shut it down here."""
    if loop.is_closed():
        orchestrator.shutdown()
        return
    with contextlib.suppress(RuntimeError):  # closed between check and call
        loop.call_soon_threadsafe(orchestrator.shutdown)


def _plain_params(params: Mapping[str, Any] | SamplingParams | None) -> Any:
    """``params`` as the stage wire carries it: upstream's ``SamplingParams``
    travels whole (msgspec JSON) to the ``vllm`` stage, which decodes it."""
    if params is None:
        return {}
    if isinstance(params, Mapping):
        return params
    import msgspec
    from vllm.sampling_params import SamplingParams

    if isinstance(params, SamplingParams):
        return {"sampling_params": msgspec.json.encode(params)}
    return params
