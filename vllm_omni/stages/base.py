"""The stage contract: one request in, an async stream of ``Payload`` chunks out.

A stage raises semantic exceptions, never builds records or messages, and
stays preemptible (docs/runtime.md §1).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import re
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.errors import VLLMValidationError
from vllm_omni.stages.ranges import SIZE_STEP, ParamRange
from vllm_omni.wire.messages import Payload, Submit

__all__ = ["SIZE_STEP", "Stage", "bounded_float", "bounded_int", "parse_size"]

_T = TypeVar("_T")

_SIZE_RE = re.compile(r"([0-9]{1,5})[xX]([0-9]{1,5})")


class Stage(abc.ABC):
    """Base class of every stage implementation."""

    kind: ClassVar[str]
    # The values it accepts for each ``params`` key it checks, published
    # through the registry (``vllm_omni.stages.stage_ranges``); None where
    # upstream checks them (a ``vllm`` stage's ``SamplingParams``).
    RANGES: ClassVar[Mapping[str, ParamRange] | None] = {}
    # Whether it builds a vLLM engine, whose ``vllm:`` families a stage in
    # the orchestrator's process takes from the default registry
    # (``vllm_omni.engine.inline``); no other stage takes any.
    ENGINE_METRICS: ClassVar[bool] = False

    def __init__(self, config: StageConfig, pipeline: PipelineConfig) -> None:
        self.config = config
        self.pipeline = pipeline
        self._device: ThreadPoolExecutor | None = None

    async def on_device(self, work: Callable[..., _T], *args: Any) -> _T:
        """Run ``work(*args)`` on the stage's device: one worker thread per
        stage, one piece of work at a time, as a model stage runs one batch
        at a time on its accelerator. The reference stages compute on the
        CPU what a model computes on its device; in the default executor's
        threads one stage would take every core of the host (the API server's
        included), which no device-bound stage does. The stage's event loop
        stays free meanwhile."""
        if self._device is None:
            self._device = ThreadPoolExecutor(
                1, thread_name_prefix=f"stage-{self.config.id}-device"
            )
        return await asyncio.get_running_loop().run_in_executor(
            self._device, functools.partial(work, *args)
        )

    @classmethod  # noqa: B027 - optional hook
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Raise what ``generate`` would raise for ``params`` alone, before
        anything runs (a caller's per-stage entry, ``sampling_params_list``).
        Default: nothing to check."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Prepare to serve (load weights, build engines). Default: nothing."""

    @abc.abstractmethod
    def generate(self, request: Submit) -> AsyncIterator[Payload]:
        """Produce the request's result as a stream of chunks."""

    def check_health(self) -> None:  # noqa: B027 - optional hook
        """Raise when the stage can no longer serve anything (its engine
        died); the exception is the stage's death, as ``EngineDeadError``
        raised by a request is. Asked about every 100 ms of a stage in the
        orchestrator's process (``engine.inline``), so it must be cheap and
        must not wait. Default: nothing."""

    def fault_status(self) -> Mapping[str, Any] | None:
        """The stage engine's fault-tolerance status, as vLLM 0.34's engine
        client caches it (``engine_status``: ``{"id": 0, "status":
        "healthy"}``, the status one of ``healthy``, ``diagnosing``,
        ``unhealthy``, ``dead``); ``None`` when its engine runs no fault
        tolerance. Asked about every 100 ms, so it must be cheap and must not
        wait. Default: ``None``."""
        return None

    def recovery_window_s(self) -> float | None:
        """How long the engine waits for a recovery once it faulted
        (vLLM's ``engine_recovery_timeout_sec``); ``None`` without fault
        tolerance. Default: ``None``."""
        return None

    async def handle_fault(
        self, instruction: str, params: Mapping[str, Any], request_id: str
    ) -> Mapping[str, Any]:
        """Apply a fault-tolerance instruction (``retry``, ``scale_down``)
        through the engine's own interface; the result as vLLM 0.34's
        ``FaultToleranceResult`` fields (``request_id``, ``success``,
        ``reason``). Default: a stage without fault tolerance refuses."""
        return {
            "request_id": request_id,
            "success": False,
            "reason": "the stage has no fault tolerance",
        }

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release resources before the process exits. Default: nothing. A
        stage that may run in the orchestrator's process must not await
        anything here: the engine's shutdown is synchronous."""


def bounded_int(
    params: Mapping[str, Any], name: str, default: int | None, low: int, high: int
) -> int | None:
    """``params[name]`` as an int in ``[low, high]``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
    ):
        raise VLLMValidationError(
            f"{name} must be an integer between {low} and {high}",
            parameter=name,
            value=value,
        )
    return value


def bounded_float(
    params: Mapping[str, Any], name: str, default: float, low: float, high: float
) -> float:
    """``params[name]`` as a number in ``[low, high]``, or ``default`` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not low <= value <= high
    ):
        raise VLLMValidationError(
            f"{name} must be a number between {low:g} and {high:g}",
            parameter=name,
            value=value,
        )
    return float(value)


def parse_size(
    params: Mapping[str, Any], default: str, low: int, high: int, name: str = "size"
) -> tuple[int, int]:
    """``"WxH"`` with each side in ``[low, high]`` and a multiple of 8."""
    value = params.get(name, default)
    match = _SIZE_RE.fullmatch(value) if isinstance(value, str) else None
    width, height = (int(match[1]), int(match[2])) if match else (-1, -1)
    for side in (width, height):
        if not low <= side <= high or side % SIZE_STEP:
            raise VLLMValidationError(
                f"{name} must be 'WxH' with each side between {low} and {high} "
                f"and a multiple of {SIZE_STEP}",
                parameter=name,
                value=value,
            )
    return width, height
