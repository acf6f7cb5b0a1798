"""Checking a parsed pipeline document, key by key.

A bad key raises ``PipelineConfigError`` naming its key path
(``stages[1].kind``); the public loaders turn it into ``VLLMValidationError``
with that path as ``parameter``. Nothing here imports vLLM unless a
``raise`` fault's exception class is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, cast, get_args

from vllm_omni.config.fault import FaultAction, FaultConfig, resolve_exception
from vllm_omni.config.pipeline import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_RAY_PROBE_INTERVAL_S,
    DEFAULT_RAY_PROBE_TIMEOUT_S,
    DEFAULT_SILENCE_TIMEOUT_S,
    HEARTBEAT_INTERVAL_S,
    PipelineConfig,
    WorkerBackend,
)
from vllm_omni.config.stage import RayStageOptions, StageConfig, StageKind

__all__ = [
    "PipelineConfigError",
    "as_validation_error",
    "liveness_settings",
    "reject",
    "validate_pipeline",
]

# The keys each mapping of a pipeline file may have.
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


def reject(message: str, parameter: str) -> NoReturn:
    """Refuse the key at ``parameter`` (a key path) for ``message``."""
    raise PipelineConfigError(
        f"invalid pipeline config at {parameter}: {message}", parameter
    )


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        path = f"{where}.{unknown[0]}" if where else unknown[0]
        reject(f"unknown key {unknown[0]!r} (allowed: {sorted(allowed)})", path)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ray_options(raw: object, where: str) -> RayStageOptions:
    if not isinstance(raw, Mapping):
        reject("ray must be a mapping", where)
    _check_keys(raw, _RAY_KEYS, where)
    for key in ("num_cpus", "num_gpus"):
        value = raw.get(key, 0)
        if not _is_number(value) or value < 0:
            reject(f"{key} must be a non-negative number", f"{where}.{key}")
    resources = raw.get("resources", {})
    if not isinstance(resources, Mapping) or not all(
        isinstance(k, str) and k and _is_number(v) and v > 0
        for k, v in resources.items()
    ):
        reject("resources must map names to positive numbers", f"{where}.resources")
    labels = raw.get("label_selector", {})
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()
    ):
        reject("label_selector must map strings to strings", f"{where}.label_selector")
    return RayStageOptions(
        num_cpus=float(raw.get("num_cpus", 0)),
        num_gpus=float(raw.get("num_gpus", 0)),
        resources={k: float(v) for k, v in resources.items()},
        label_selector=dict(labels),
    )


def _ray_probe(raw: object) -> tuple[float, float]:
    """The top-level ``ray:`` keys: the probe's interval and timeout."""
    if not isinstance(raw, Mapping):
        reject("ray must be a mapping", "ray")
    _check_keys(raw, _RAY_PROBE_KEYS, "ray")
    values = {
        "probe_interval_s": raw.get("probe_interval_s", DEFAULT_RAY_PROBE_INTERVAL_S),
        "probe_timeout_s": raw.get("probe_timeout_s", DEFAULT_RAY_PROBE_TIMEOUT_S),
    }
    for key, value in values.items():
        if not _is_number(value) or value <= 0:
            reject(f"{key} must be a positive number", f"ray.{key}")
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
        reject("orchestrator_address must be tcp://HOST:PORT", "orchestrator_address")
    return host.strip("[]"), int(port)


def liveness_settings(
    heartbeat_timeout_s: object, silence_timeout_s: object, *, prefix: str = ""
) -> tuple[float, float | None]:
    """Checked heartbeat and silence timeouts; ``silence_timeout_s`` None is
    the default (3 s), or no silence at all when the heartbeat timeout is not
    above it (the stage is dead first). ``PipelineConfigError`` names the bad
    one (``prefix`` + its name)."""
    if not _is_number(heartbeat_timeout_s) or heartbeat_timeout_s <= 0:
        reject(
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
        reject(
            f"silence_timeout_s must be a number above the {HEARTBEAT_INTERVAL_S:g} s "
            f"heartbeat interval and below heartbeat_timeout_s ({heartbeat:g} s)",
            f"{prefix}silence_timeout_s",
        )
    return heartbeat, float(silence_timeout_s)


def _stage(raw: object, index: int) -> StageConfig:
    where = f"stages[{index}]"
    if not isinstance(raw, Mapping):
        reject("each stage must be a mapping", where)
    _check_keys(raw, _STAGE_KEYS, where)
    stage_id = raw.get("id", index)
    if not _is_int(stage_id) or stage_id < 0:
        reject("stage id must be a non-negative integer", f"{where}.id")
    kind = raw.get("kind")
    if kind not in get_args(StageKind):
        reject(f"stage kind must be one of {get_args(StageKind)}", f"{where}.kind")
    name = raw.get("name", kind)
    if not isinstance(name, str) or not name:
        reject("stage name must be a non-empty string", f"{where}.name")
    timeout = raw.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or timeout <= 0
    ):
        reject("timeout_s must be a positive number", f"{where}.timeout_s")
    limit = raw.get("max_num_queued_reqs")
    if limit is not None and (not _is_int(limit) or limit < 1):
        reject(
            "max_num_queued_reqs must be a positive integer",
            f"{where}.max_num_queued_reqs",
        )
    for flag in ("remote", "legacy_wire"):
        if not isinstance(raw.get(flag, False), bool):
            reject(f"{flag} must be true or false", f"{where}.{flag}")
    in_process = raw.get("in_process")
    if in_process is not None and not isinstance(in_process, bool):
        reject("in_process must be true or false", f"{where}.in_process")
    if in_process and raw.get("remote", False):
        reject(
            "a remote stage runs on another host, not in the orchestrator's "
            "process: set remote or in_process, not both",
            f"{where}.in_process",
        )
    options = raw.get("options", {})
    if not isinstance(options, Mapping):
        reject("options must be a mapping", f"{where}.options")
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
        reject(
            "vLLM fault tolerance is not supported in this vllm stage: vLLM "
            "runs it only with external-load-balancer data parallelism "
            "(data_parallel_external_lb or data_parallel_rank in engine_args); "
            "set one, or remove it",
            f"{where}.engine_args.{key}",
        )


def _fault(raw: object, index: int, stages: tuple[StageConfig, ...]) -> FaultConfig:
    where = f"faults[{index}]"
    if not isinstance(raw, Mapping):
        reject("each fault must be a mapping", where)
    _check_keys(raw, _FAULT_KEYS, where)
    ref = raw.get("stage")
    matches = [
        s.id for s in stages if ref in (s.id, s.name) and not isinstance(ref, bool)
    ]
    if not matches:
        reject("fault stage must name a stage id or name", f"{where}.stage")
    marker = raw.get("marker")
    if not isinstance(marker, str) or not marker:
        reject("fault marker must be a non-empty string", f"{where}.marker")
    action = raw.get("action")
    if action not in get_args(FaultAction):
        reject(
            f"fault action must be one of {get_args(FaultAction)}", f"{where}.action"
        )
    exception = raw.get("exception")
    if exception is not None and (action != "raise" or not isinstance(exception, str)):
        reject("exception is a 'module:Name' string for raise", f"{where}.exception")
    args = raw.get("args", [])
    kwargs = raw.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, Mapping):
        reject("args must be a list and kwargs a mapping", f"{where}.args")
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
        reject(str(exc), f"{where}.exception")
    try:
        fault.build_exception()
    except Exception as exc:  # whatever the constructor rejects the args with
        first = str(exc).splitlines()[0] if str(exc) else ""
        reject(
            f"{fault.exception} cannot be built from args/kwargs "
            f"({type(exc).__name__}: {first})",
            f"{where}.kwargs" if fault.kwargs else f"{where}.args",
        )


def validate_pipeline(
    data: object, *, source: str, build_faults: bool
) -> PipelineConfig:
    """The pipeline a parsed document describes; ``build_faults`` also builds
    each ``raise`` fault's exception (which imports vLLM)."""
    if not isinstance(data, Mapping):
        reject("the document must be a mapping", "pipeline")
    _check_keys(data, _TOP_KEYS, "")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        reject("model must be a non-empty string", "model")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        reject("stages must be a non-empty list", "stages")
    stages = tuple(_stage(raw, i) for i, raw in enumerate(raw_stages))
    ids = [s.id for s in stages]
    if len(set(ids)) != len(ids):
        reject("stage ids must be unique", "stages")
    guardrail = data.get("guardrail") or {}
    if not isinstance(guardrail, Mapping):
        reject("guardrail must be a mapping", "guardrail")
    _check_keys(guardrail, {"blocklist"}, "guardrail")
    blocklist = guardrail.get("blocklist", [])
    if not isinstance(blocklist, list) or not all(
        isinstance(term, str) and term for term in blocklist
    ):
        reject("blocklist must be a list of non-empty strings", "guardrail.blocklist")
    if blocklist and not any(s.kind == "guardrail" for s in stages):
        reject(
            "a blocklist needs a stage of kind 'guardrail' to enforce it",
            "guardrail.blocklist",
        )
    raw_faults = data.get("faults") or []
    if not isinstance(raw_faults, list):
        reject("faults must be a list", "faults")
    faults = tuple(_fault(raw, i, stages) for i, raw in enumerate(raw_faults))
    if build_faults:
        for index, fault in enumerate(faults):
            _check_fault_exception(fault, f"faults[{index}]")
    backend = data.get("worker_backend", "multi_process")
    if backend not in get_args(WorkerBackend):
        reject(
            f"worker_backend must be one of {get_args(WorkerBackend)}",
            "worker_backend",
        )
    ray_address = data.get("ray_address")
    if ray_address is not None and (
        not isinstance(ray_address, str) or not ray_address
    ):
        reject("ray_address must be a non-empty string", "ray_address")
    init_timeout = data.get("stage_init_timeout_s", 120.0)
    if not _is_number(init_timeout) or init_timeout <= 0:
        reject("stage_init_timeout_s must be a positive number", "stage_init_timeout_s")
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


@contextlib.contextmanager
def as_validation_error() -> Iterator[None]:
    """A ``PipelineConfigError`` raised inside becomes ``VLLMValidationError``
    (the key path its ``parameter``), for Python callers."""
    try:
        yield
    except PipelineConfigError as exc:
        from vllm_omni.errors import VLLMValidationError

        raise VLLMValidationError(str(exc), parameter=exc.parameter) from None
