"""Pipeline configuration: the YAML that says which stages a pipeline runs.

Owns the schema and its validation: ``load_pipeline`` turns the built-in name
``reference`` or a YAML file path into a frozen ``PipelineConfig``, and
rejects a bad file with a ``VLLMValidationError`` whose ``parameter`` is the
offending key path (``stages[1].kind``). ``check_pipeline`` is the same check
for ``vllm-omni serve`` before it imports vLLM: it raises the light
``PipelineConfigError`` (``file:line:column`` for YAML errors, the key path
for schema errors) and skips what needs vLLM (building fault exceptions).
It must not start processes, import stage implementations or touch the
network: the orchestrator and the stage workers read the result. It sits
below the engine and imports nothing of it (the engine's ``faults`` reads
``FaultConfig``, never the other way): the exception class a ``raise`` fault
names is resolved here (``resolve_exception``, ``FaultConfig.build_exception``),
because whether a file may name it is part of the schema. Importing it must
stay cheap (no vLLM): the exception classes are imported when needed.

Schema::

    model: omni-reference
    stages:                       # at least one; ids unique, >= 0
      - {id: 0, name: thinker, kind: text, timeout_s: 30}
      - {id: 1, name: talker, kind: talker, remote: false, legacy_wire: false}
      - {id: 2, name: gpu, kind: vllm, options: {engine_args: {model: ...}}}
      - {id: 3, name: image, kind: image, max_num_queued_reqs: 8}
    guardrail:
      blocklist: [forbidden-topic]
    faults:                       # drills and tests only
      - {stage: 1, marker: "@boom", action: raise}            # RuntimeError
      - {stage: 1, marker: "@404", action: raise,
         exception: "vllm.exceptions:VLLMNotFoundError", args: ["gone"]}
      - {stage: talker, marker: "@exit", action: exit}        # os._exit(1)
      - {stage: 1, marker: "@hang", action: hang}             # past the deadline

Where a stage runs (``in_process``): a stage whose ``in_process`` is true
runs in the orchestrator's process instead of a stage process of its own,
when the engine runs its stages as local processes (not Ray), the stage is
not ``remote`` and no fault drill is aimed at it (a drill may exit or hang
its process). The default is true for the guardrail (its check is a few
microseconds, a process hop hundreds) and false for every other kind. A
``vllm`` stage with ``in_process: true`` runs upstream's ``AsyncLLM`` in the
orchestrator's process, as ``vllm serve`` runs it in its API server: no
process hop per request and per token, its EngineCore a process of its own
as always. A stage there shares the orchestrator's event loop, so only a
stage whose work awaits belongs there (not an image or video stage, whose
work holds the CPU)::

    stages:
      - {id: 0, name: guardrail, kind: guardrail}           # in process
      - {id: 1, name: thinker, kind: vllm, in_process: true,
         options: {engine_args: {model: ...}}}

A stage's ``max_num_queued_reqs`` bounds the requests that stage holds at
once (the engine-wide ``--max-num-queued-reqs`` still applies): a request
handed to a full stage is refused with ``QueueOverflowError`` (503, with that
``stage_id``) and aborted in the stages it went through.

Stages on other hosts (``remote: true``, started there with ``python -m
vllm_omni.engine.stage_worker --connect tcp://HOST:PORT ...``) and how long
a stage may stay silent (the engine's ``transport``/``host``/``port``,
``heartbeat_timeout_s`` and ``silence_timeout_s`` arguments override these)::

    orchestrator_address: tcp://10.0.0.1:5555  # bind tcp here (port 0: any)
    silence_timeout_s: 3          # not heard from: 504 held, 503 needed
    heartbeat_timeout_s: 10       # not heard from: the engine is dead

Running the stages as Ray actors (``worker_backend: ray``; the engine's
``worker_backend``/``ray_address`` arguments and ``vllm-omni serve
--worker-backend/--ray-address`` override these keys)::

    worker_backend: ray           # multi_process (default) | ray
    ray_address: 10.0.0.1:6379    # join this cluster; absent: a local instance
    stage_init_timeout_s: 120     # placement + actor start, per stage
    ray:                          # the request-time probe of actors and GCS
      probe_interval_s: 1         # how often
      probe_timeout_s: 2          # a stage or the GCS silent this long: 504/503
    stages:
      - {id: 1, kind: text, ray: {num_cpus: 1, num_gpus: 1,
                                  resources: {big_node: 1},
                                  label_selector: {zone: a}}}
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NoReturn, cast, get_args

import yaml

__all__ = [
    "BUILTIN_PIPELINES",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "DEFAULT_RAY_PROBE_INTERVAL_S",
    "DEFAULT_RAY_PROBE_TIMEOUT_S",
    "DEFAULT_SILENCE_TIMEOUT_S",
    "FAULT_EXCEPTION_MODULES",
    "HEARTBEAT_INTERVAL_S",
    "FaultConfig",
    "PipelineConfig",
    "PipelineConfigError",
    "RayStageOptions",
    "StageConfig",
    "StageKind",
    "WorkerBackend",
    "check_model_pipeline",
    "check_pipeline",
    "liveness_settings",
    "load_pipeline",
    "pipeline_for_model",
    "pipeline_from_mapping",
    "resolve_exception",
    "with_traces_endpoint",
]

StageKind = Literal["text", "talker", "vocoder", "image", "video", "guardrail", "vllm"]
FaultAction = Literal["raise", "exit", "hang"]
WorkerBackend = Literal["multi_process", "ray"]
BUILTIN_PIPELINES = ("reference",)

_STAGE_KEYS = {
    "id",
    "name",
    "kind",
    "timeout_s",
    "max_num_queued_reqs",
    "remote",
    "legacy_wire",
    "in_process",
    "options",
    "ray",
}
_FAULT_KEYS = {"stage", "marker", "action", "exception", "args", "kwargs"}
_TOP_KEYS = {
    "model",
    "stages",
    "guardrail",
    "faults",
    "worker_backend",
    "ray_address",
    "stage_init_timeout_s",
    "ray",
    "orchestrator_address",
    "heartbeat_timeout_s",
    "silence_timeout_s",
}
_RAY_KEYS = {"num_cpus", "num_gpus", "resources", "label_selector"}
_RAY_PROBE_KEYS = {"probe_interval_s", "probe_timeout_s"}
# The Ray backend's request-time probe: often enough that a silent stage fails
# its requests within seconds, with a deadline far above a healthy ping
# (about a millisecond) so that a loaded host does not pass for a stall.
DEFAULT_RAY_PROBE_INTERVAL_S = 1.0
DEFAULT_RAY_PROBE_TIMEOUT_S = 2.0
# Stage and orchestrator each send a heartbeat this often on the wire. A stage
# on another host (remote, or a Ray actor) not heard from for
# ``silence_timeout_s`` is silent (504 for what it holds, 503 for what needs
# it); for ``heartbeat_timeout_s``, dead. Three missed heartbeats make a
# silence: one late heartbeat on a loaded host does not.
HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0
DEFAULT_SILENCE_TIMEOUT_S = 3.0
# The modules a ``raise`` fault may take its exception class from: only those
# that own error types, so a pipeline file cannot name arbitrary code.
FAULT_EXCEPTION_MODULES = (
    "builtins",
    "asyncio.exceptions",
    "vllm.exceptions",
    "vllm.v1.engine.exceptions",
    "vllm_omni.errors",
    "vllm_omni.errors.types",
)


@dataclass(frozen=True, slots=True)
class RayStageOptions:
    """Where a stage's Ray actor may be placed (``worker_backend: ray`` only)."""

    # Reference stages are light; a stage that needs a CPU or GPU of its own
    # says so, like upstream actors that reserve nothing unless asked.
    num_cpus: float = 0.0
    num_gpus: float = 0.0
    # Custom resources (a node started with ``--resources`` offers them).
    resources: Mapping[str, float] = field(default_factory=dict)
    # Node labels the actor must land on (``ray start --labels``).
    label_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StageConfig:
    """One stage: what it runs and how long a request may take in it."""

    id: int
    name: str
    kind: StageKind
    timeout_s: float | None = None
    # Requests this stage may hold at once; one more handed to it is refused
    # with QueueOverflowError (503). None: only the engine's limit applies.
    max_num_queued_reqs: int | None = None
    # Started by an operator on another host; the orchestrator only waits for it.
    remote: bool = False
    # Send errors with only the 0.30 flat fields (for a strict old orchestrator).
    legacy_wire: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    ray: RayStageOptions = field(default_factory=RayStageOptions)
    # Run in the orchestrator's process (see the module docstring); None: the
    # kind's default (``vllm_omni.stages.INLINE_KINDS``).
    in_process: bool | None = None


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """A drill: when a prompt contains ``marker``, stage ``stage`` misbehaves."""

    stage: int
    marker: str
    action: FaultAction
    # For ``raise``: "module:QualName" of the exception class and its arguments.
    exception: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def build_exception(self) -> BaseException:
        """The exception a ``raise`` fault throws (a ``RuntimeError`` unless
        it names one)."""
        if self.exception is None:
            return RuntimeError(f"injected fault {self.marker!r}")
        return resolve_exception(self.exception)(*self.args, **dict(self.kwargs))


def resolve_exception(name: str) -> type[BaseException]:
    """The exception class ``"module:Name"`` (or a bare name) stands for;
    ``LookupError`` unless it is one from the modules that own error types
    (imported here, on first use: they import vLLM)."""
    module_name, _, attr = name.rpartition(":")
    candidates = [module_name] if module_name else ["vllm_omni.errors", "builtins"]
    for candidate in candidates:
        if candidate not in FAULT_EXCEPTION_MODULES:
            break
        module = (
            builtins if candidate == "builtins" else importlib.import_module(candidate)
        )
        value = getattr(module, attr, None)
        if isinstance(value, type) and issubclass(value, BaseException):
            return value
    raise LookupError(
        f"{name!r} is not an exception class of {', '.join(FAULT_EXCEPTION_MODULES)}"
    )


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """A validated pipeline: the model name, its stages, guardrail and faults."""

    model: str
    stages: tuple[StageConfig, ...]
    guardrail_blocklist: tuple[str, ...] = ()
    faults: tuple[FaultConfig, ...] = ()
    source: str = "<memory>"
    worker_backend: WorkerBackend = "multi_process"
    ray_address: str | None = None
    stage_init_timeout_s: float = 120.0
    ray_probe_interval_s: float = DEFAULT_RAY_PROBE_INTERVAL_S
    ray_probe_timeout_s: float = DEFAULT_RAY_PROBE_TIMEOUT_S
    # Where the orchestrator binds tcp for stages on other hosts: (host, port).
    orchestrator_address: tuple[str, int] | None = None
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    # As written (None: the default, see ``liveness_settings``).
    silence_timeout_s: float | None = None
    # Where every process of the engine exports its spans (``--otlp-traces-
    # endpoint``; None: each process's OTEL_* environment). Set by the
    # engine (``with_traces_endpoint``), not read from a pipeline file.
    otlp_traces_endpoint: str | None = None

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise RuntimeError(f"pipeline has no stage {stage_id}")

    def faults_for(self, stage_id: int) -> tuple[FaultConfig, ...]:
        return tuple(f for f in self.faults if f.stage == stage_id)


class PipelineConfigError(ValueError):
    """A pipeline that cannot be loaded: where (key path or file position) and why.

    Raised by ``check_pipeline``; the public loaders turn it into
    ``VLLMValidationError`` with the key path as ``parameter``.
    """

    def __init__(self, message: str, parameter: str, *, source: str = "") -> None:
        super().__init__(f"{source}: {message}" if source else message)
        self.message = message
        self.parameter = parameter
        self.source = source


def _reject(message: str, parameter: str) -> NoReturn:
    raise PipelineConfigError(
        f"invalid pipeline config at {parameter}: {message}", parameter
    )


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        path = f"{where}.{unknown[0]}" if where else unknown[0]
        _reject(f"unknown key {unknown[0]!r} (allowed: {sorted(allowed)})", path)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ray_options(raw: object, where: str) -> RayStageOptions:
    if not isinstance(raw, Mapping):
        _reject("ray must be a mapping", where)
    _check_keys(raw, _RAY_KEYS, where)
    for key in ("num_cpus", "num_gpus"):
        value = raw.get(key, 0)
        if not _is_number(value) or value < 0:
            _reject(f"{key} must be a non-negative number", f"{where}.{key}")
    resources = raw.get("resources", {})
    if not isinstance(resources, Mapping) or not all(
        isinstance(k, str) and k and _is_number(v) and v > 0
        for k, v in resources.items()
    ):
        _reject("resources must map names to positive numbers", f"{where}.resources")
    labels = raw.get("label_selector", {})
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()
    ):
        _reject("label_selector must map strings to strings", f"{where}.label_selector")
    return RayStageOptions(
        num_cpus=float(raw.get("num_cpus", 0)),
        num_gpus=float(raw.get("num_gpus", 0)),
        resources={k: float(v) for k, v in resources.items()},
        label_selector=dict(labels),
    )


def _ray_probe(raw: object) -> tuple[float, float]:
    """The top-level ``ray:`` keys: the probe's interval and timeout."""
    if not isinstance(raw, Mapping):
        _reject("ray must be a mapping", "ray")
    _check_keys(raw, _RAY_PROBE_KEYS, "ray")
    values = {
        "probe_interval_s": raw.get("probe_interval_s", DEFAULT_RAY_PROBE_INTERVAL_S),
        "probe_timeout_s": raw.get("probe_timeout_s", DEFAULT_RAY_PROBE_TIMEOUT_S),
    }
    for key, value in values.items():
        if not _is_number(value) or value <= 0:
            _reject(f"{key} must be a positive number", f"ray.{key}")
    return float(values["probe_interval_s"]), float(values["probe_timeout_s"])


def _orchestrator_address(raw: object) -> tuple[str, int] | None:
    """``tcp://HOST:PORT`` (the address remote stages ``--connect`` to) as
    (host, port)."""
    if raw is None:
        return None
    host, _, port = str(raw).removeprefix("tcp://").rpartition(":")
    if (
        not isinstance(raw, str)
        or not raw.startswith("tcp://")
        or not host
        or not port.isdigit()
        or int(port) > 65535
    ):
        _reject("orchestrator_address must be tcp://HOST:PORT", "orchestrator_address")
    return host.strip("[]"), int(port)


def liveness_settings(
    heartbeat_timeout_s: object, silence_timeout_s: object, *, prefix: str = ""
) -> tuple[float, float | None]:
    """Checked heartbeat and silence timeouts; ``silence_timeout_s`` None is
    the default (3 s), or no silence at all when the heartbeat timeout is not
    above it (the stage is dead first). ``PipelineConfigError`` names the bad
    one (``prefix`` + its name)."""
    if not _is_number(heartbeat_timeout_s) or heartbeat_timeout_s <= 0:
        _reject(
            "heartbeat_timeout_s must be a positive number",
            f"{prefix}heartbeat_timeout_s",
        )
    heartbeat = float(heartbeat_timeout_s)
    if silence_timeout_s is None:
        default = DEFAULT_SILENCE_TIMEOUT_S
        return heartbeat, default if default < heartbeat else None
    if (
        not _is_number(silence_timeout_s)
        or not HEARTBEAT_INTERVAL_S < silence_timeout_s < heartbeat
    ):
        # At or below the heartbeat interval a healthy stage would go silent
        # between two heartbeats; at or above the heartbeat timeout it is dead
        # before it could be silent.
        _reject(
            f"silence_timeout_s must be a number above the {HEARTBEAT_INTERVAL_S:g} s "
            f"heartbeat interval and below heartbeat_timeout_s ({heartbeat:g} s)",
            f"{prefix}silence_timeout_s",
        )
    return heartbeat, float(silence_timeout_s)


def _stage(raw: object, index: int) -> StageConfig:
    where = f"stages[{index}]"
    if not isinstance(raw, Mapping):
        _reject("each stage must be a mapping", where)
    _check_keys(raw, _STAGE_KEYS, where)
    stage_id = raw.get("id", index)
    if not _is_int(stage_id) or stage_id < 0:
        _reject("stage id must be a non-negative integer", f"{where}.id")
    kind = raw.get("kind")
    if kind not in get_args(StageKind):
        _reject(f"stage kind must be one of {get_args(StageKind)}", f"{where}.kind")
    name = raw.get("name", kind)
    if not isinstance(name, str) or not name:
        _reject("stage name must be a non-empty string", f"{where}.name")
    timeout = raw.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or timeout <= 0
    ):
        _reject("timeout_s must be a positive number", f"{where}.timeout_s")
    limit = raw.get("max_num_queued_reqs")
    if limit is not None and (not _is_int(limit) or limit < 1):
        _reject(
            "max_num_queued_reqs must be a positive integer",
            f"{where}.max_num_queued_reqs",
        )
    for flag in ("remote", "legacy_wire"):
        if not isinstance(raw.get(flag, False), bool):
            _reject(f"{flag} must be true or false", f"{where}.{flag}")
    in_process = raw.get("in_process")
    if in_process is not None and not isinstance(in_process, bool):
        _reject("in_process must be true or false", f"{where}.in_process")
    if in_process and raw.get("remote", False):
        _reject(
            "a remote stage runs on another host, not in the orchestrator's "
            "process: set remote or in_process, not both",
            f"{where}.in_process",
        )
    options = raw.get("options", {})
    if not isinstance(options, Mapping):
        _reject("options must be a mapping", f"{where}.options")
    if kind == "vllm":
        _refuse_fault_tolerance(options.get("engine_args"), f"{where}.options")
    return StageConfig(
        id=stage_id,
        name=name,
        kind=cast(StageKind, kind),
        timeout_s=None if timeout is None else float(timeout),
        max_num_queued_reqs=limit,
        remote=raw.get("remote", False),
        legacy_wire=raw.get("legacy_wire", False),
        options=dict(options),
        ray=_ray_options(raw.get("ray", {}), f"{where}.ray"),
        in_process=in_process,
    )


# vLLM's fault tolerance (a faulted engine pauses, refuses new requests and
# waits for a recovery instruction) is honoured: the stage reports its
# engine's status, the server refuses and drives the recovery
# (engine.fault_tolerance). vLLM runs it only with external-load-balancer data
# parallelism; without it, the stage's start would fail with vLLM's own
# ValueError: refused at load instead, in one line naming the option and why
# (docs/errors/stages.md, "vLLM builds").
_FAULT_TOLERANCE_KEYS = ("enable_fault_tolerance", "fault_tolerance_config")


def _refuse_fault_tolerance(engine_args: object, where: str) -> None:
    if not isinstance(engine_args, Mapping):
        return
    key = next(
        (k for k in _FAULT_TOLERANCE_KEYS if engine_args.get(k) not in (None, False)),
        None,
    )
    # vLLM's own test: the flag, or a rank given (0 is a rank).
    external_lb = (
        engine_args.get("data_parallel_external_lb") is True
        or engine_args.get("data_parallel_rank") is not None
    )
    if key is not None and not external_lb:
        _reject(
            "vLLM fault tolerance is not supported in this vllm stage: vLLM "
            "runs it only with external-load-balancer data parallelism "
            "(data_parallel_external_lb or data_parallel_rank in engine_args); "
            "set one, or remove it",
            f"{where}.engine_args.{key}",
        )


def _fault(raw: object, index: int, stages: tuple[StageConfig, ...]) -> FaultConfig:
    where = f"faults[{index}]"
    if not isinstance(raw, Mapping):
        _reject("each fault must be a mapping", where)
    _check_keys(raw, _FAULT_KEYS, where)
    ref = raw.get("stage")
    matches = [
        s.id for s in stages if ref in (s.id, s.name) and not isinstance(ref, bool)
    ]
    if not matches:
        _reject("fault stage must name a stage id or name", f"{where}.stage")
    marker = raw.get("marker")
    if not isinstance(marker, str) or not marker:
        _reject("fault marker must be a non-empty string", f"{where}.marker")
    action = raw.get("action")
    if action not in get_args(FaultAction):
        _reject(
            f"fault action must be one of {get_args(FaultAction)}", f"{where}.action"
        )
    exception = raw.get("exception")
    if exception is not None and (action != "raise" or not isinstance(exception, str)):
        _reject("exception is a 'module:Name' string for raise", f"{where}.exception")
    args = raw.get("args", [])
    kwargs = raw.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, Mapping):
        _reject("args must be a list and kwargs a mapping", f"{where}.args")
    return FaultConfig(
        stage=matches[0],
        marker=marker,
        action=cast(FaultAction, action),
        exception=exception,
        args=tuple(args),
        kwargs=dict(kwargs),
    )


def _check_fault_exception(fault: FaultConfig, where: str) -> None:
    """A ``raise`` fault must name an exception that its arguments can build,
    or the drill would fail only at request time (as a 500)."""
    if fault.action != "raise" or fault.exception is None:
        return
    try:
        resolve_exception(fault.exception)
    except LookupError as exc:
        _reject(str(exc), f"{where}.exception")
    try:
        fault.build_exception()
    except Exception as exc:  # whatever the constructor rejects the args with
        first = str(exc).splitlines()[0] if str(exc) else ""
        _reject(
            f"{fault.exception} cannot be built from args/kwargs "
            f"({type(exc).__name__}: {first})",
            f"{where}.kwargs" if fault.kwargs else f"{where}.args",
        )


def _from_mapping(data: object, *, source: str, build_faults: bool) -> PipelineConfig:
    if not isinstance(data, Mapping):
        _reject("the document must be a mapping", "pipeline")
    _check_keys(data, _TOP_KEYS, "")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        _reject("model must be a non-empty string", "model")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        _reject("stages must be a non-empty list", "stages")
    stages = tuple(_stage(raw, i) for i, raw in enumerate(raw_stages))
    ids = [s.id for s in stages]
    if len(set(ids)) != len(ids):
        _reject("stage ids must be unique", "stages")
    guardrail = data.get("guardrail") or {}
    if not isinstance(guardrail, Mapping):
        _reject("guardrail must be a mapping", "guardrail")
    _check_keys(guardrail, {"blocklist"}, "guardrail")
    blocklist = guardrail.get("blocklist", [])
    if not isinstance(blocklist, list) or not all(
        isinstance(term, str) and term for term in blocklist
    ):
        _reject("blocklist must be a list of non-empty strings", "guardrail.blocklist")
    if blocklist and not any(s.kind == "guardrail" for s in stages):
        _reject(
            "a blocklist needs a stage of kind 'guardrail' to enforce it",
            "guardrail.blocklist",
        )
    raw_faults = data.get("faults") or []
    if not isinstance(raw_faults, list):
        _reject("faults must be a list", "faults")
    faults = tuple(_fault(raw, i, stages) for i, raw in enumerate(raw_faults))
    if build_faults:
        for index, fault in enumerate(faults):
            _check_fault_exception(fault, f"faults[{index}]")
    backend = data.get("worker_backend", "multi_process")
    if backend not in get_args(WorkerBackend):
        _reject(
            f"worker_backend must be one of {get_args(WorkerBackend)}",
            "worker_backend",
        )
    ray_address = data.get("ray_address")
    if ray_address is not None and (
        not isinstance(ray_address, str) or not ray_address
    ):
        _reject("ray_address must be a non-empty string", "ray_address")
    init_timeout = data.get("stage_init_timeout_s", 120.0)
    if not _is_number(init_timeout) or init_timeout <= 0:
        _reject(
            "stage_init_timeout_s must be a positive number", "stage_init_timeout_s"
        )
    probe_interval, probe_timeout = _ray_probe(data.get("ray", {}))
    heartbeat, _ = liveness_settings(
        data.get("heartbeat_timeout_s", DEFAULT_HEARTBEAT_TIMEOUT_S),
        data.get("silence_timeout_s"),
    )
    silence = data.get("silence_timeout_s")
    return PipelineConfig(
        model=model,
        stages=stages,
        guardrail_blocklist=tuple(blocklist),
        faults=faults,
        source=source,
        worker_backend=cast(WorkerBackend, backend),
        ray_address=ray_address,
        stage_init_timeout_s=float(init_timeout),
        ray_probe_interval_s=probe_interval,
        ray_probe_timeout_s=probe_timeout,
        orchestrator_address=_orchestrator_address(data.get("orchestrator_address")),
        heartbeat_timeout_s=heartbeat,
        silence_timeout_s=None if silence is None else float(silence),
    )


def pipeline_from_mapping(data: object, *, source: str = "<memory>") -> PipelineConfig:
    """Validate an already parsed pipeline document (``VLLMValidationError``)."""
    with _as_validation_error():
        return _from_mapping(data, source=source, build_faults=True)


def check_pipeline(
    spec: str | os.PathLike[str], *, build_faults: bool = True
) -> PipelineConfig:
    """Load ``reference`` or a YAML file; raise ``PipelineConfigError`` if bad.

    With ``build_faults=False`` nothing imports vLLM (fault exception classes
    are checked later, by ``load_pipeline``), so a CLI can check a file in
    milliseconds before it pays for vLLM.
    """
    if isinstance(spec, str) and spec in BUILTIN_PIPELINES:
        text = (resources.files("vllm_omni.pipelines") / f"{spec}.yaml").read_text()
        source = f"builtin:{spec}"
    else:
        path = Path(spec)
        source = str(path)
        if not path.exists():
            raise PipelineConfigError(
                f"pipeline file {source} does not exist "
                f"(built-in pipelines: {', '.join(BUILTIN_PIPELINES)})",
                "pipeline",
            )
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PipelineConfigError(
                f"cannot read pipeline file {source}: "
                f"{getattr(exc, 'strerror', None) or type(exc).__name__}",
                "pipeline",
            ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source) from None
    try:
        return _from_mapping(data, source=source, build_faults=build_faults)
    except PipelineConfigError as exc:
        raise PipelineConfigError(exc.message, exc.parameter, source=source) from None


def _yaml_error(exc: yaml.YAMLError, source: str) -> PipelineConfigError:
    """``file:line:column: message``, the position of the problem (1-based)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    where = source if mark is None else f"{source}:{mark.line + 1}:{mark.column + 1}"
    return PipelineConfigError(f"not valid YAML: {problem}", "pipeline", source=where)


@contextlib.contextmanager
def _as_validation_error() -> Iterator[None]:
    try:
        yield
    except PipelineConfigError as exc:
        from vllm_omni.errors import VLLMValidationError

        raise VLLMValidationError(str(exc), parameter=exc.parameter) from None


def load_pipeline(spec: str | os.PathLike[str] | PipelineConfig) -> PipelineConfig:
    """``reference`` (built in), a YAML file path, or an already loaded config.

    Raises ``VLLMValidationError`` naming the key path (``parameter``).
    """
    if isinstance(spec, PipelineConfig):
        return spec
    with _as_validation_error():
        return check_pipeline(spec)


# The name of the one stage a model served without a pipeline file runs in.
MODEL_STAGE_NAME = "llm"


def check_model_pipeline(
    model: str | None,
    engine_args: Mapping[str, Any] | None = None,
    *,
    base: PipelineConfig | None = None,
    served_model_name: str | None = None,
) -> PipelineConfig:
    """The pipeline ``vllm serve MODEL --omni`` and ``Omni(model=...)`` run;
    ``PipelineConfigError`` if it cannot be built (see ``pipeline_for_model``).

    Without ``base``: one ``vllm`` stage (id 0, in the orchestrator's process
    as ``vllm serve`` runs its engine) built from ``model`` and the engine
    arguments. With ``base`` (a pipeline file): the model and engine arguments
    go to its one ``vllm`` stage, over what the file says; a pipeline with no
    ``vllm`` stage, or more than one, refuses them (naming the first
    argument: never silently dropped). ``served_model_name``
    (the name clients send) defaults to the file's ``model`` or to ``model``.
    Imports nothing of vLLM: the engine arguments are checked by the stage.
    """
    given = dict(engine_args or {})
    if model is not None:
        if not isinstance(model, str) or not model:
            _reject("model must be a non-empty string", "model")
        given["model"] = model
    if base is None:
        if model is None:
            _reject("a model is needed when no pipeline is given", "model")
        stage = StageConfig(
            id=0,
            name=MODEL_STAGE_NAME,
            kind="vllm",
            in_process=True,
            options={"engine_args": given},
        )
        return PipelineConfig(
            model=served_model_name or model or "",
            stages=(stage,),
            source=f"model:{model}",
        )
    if not given:
        if served_model_name is None:
            return base
        return replace(base, model=served_model_name)
    targets = [s for s in base.stages if s.kind == "vllm"]
    if len(targets) != 1:
        first = "model" if "model" in given else next(iter(given))
        why = (
            "has no vllm stage to give it to"
            if not targets
            else f"has {len(targets)} vllm stages; name the one in its file"
        )
        raise PipelineConfigError(
            f"{first} cannot be used with pipeline {base.source}: it {why}", first
        )
    (target,) = targets
    old = target.options.get("engine_args", {})
    merged = {**(old if isinstance(old, Mapping) else {}), **given}
    stage = replace(target, options={**target.options, "engine_args": merged})
    return replace(
        base,
        model=served_model_name or base.model,
        stages=tuple(stage if s is target else s for s in base.stages),
    )


def with_traces_endpoint(
    pipeline: PipelineConfig, endpoint: str | None
) -> PipelineConfig:
    """``pipeline`` whose processes export spans to ``endpoint``: every stage
    process (``otlp_traces_endpoint``) and every ``vllm`` stage's engine
    (its ``otlp_traces_endpoint`` engine argument, unless the file sets one:
    upstream drops ``trace_headers`` without it)."""
    if endpoint is None:
        return pipeline
    stages = []
    for stage in pipeline.stages:
        engine_args = stage.options.get("engine_args")
        if stage.kind == "vllm" and isinstance(engine_args, Mapping):
            engine_args = {"otlp_traces_endpoint": endpoint, **engine_args}
            stage = replace(
                stage, options={**stage.options, "engine_args": engine_args}
            )
        stages.append(stage)
    return replace(pipeline, stages=tuple(stages), otlp_traces_endpoint=endpoint)


def pipeline_for_model(
    model: str | None,
    engine_args: Mapping[str, Any] | None = None,
    *,
    base: PipelineConfig | None = None,
    served_model_name: str | None = None,
) -> PipelineConfig:
    """``check_model_pipeline`` for Python callers: ``VLLMValidationError``
    naming the argument."""
    with _as_validation_error():
        return check_model_pipeline(
            model, engine_args, base=base, served_model_name=served_model_name
        )
