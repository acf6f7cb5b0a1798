"""Acts on what stages report of their engines' fault tolerance: fails and
refuses around a faulted stage, and drives its recovery (docs/design.md §6)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from vllm_omni.engine.fault_tolerance import (
    INSTRUCTIONS,
    UNHEALTHY,
    Change,
    checked_result,
    checked_status,
    recovery_request_id,
)
from vllm_omni.engine.request_table import RequestTable
from vllm_omni.engine.stage_channel import StageChannel
from vllm_omni.engine.stage_handle import StageHandle
from vllm_omni.errors import (
    OmniConflictError,
    OmniServiceUnavailableError,
    VLLMNotFoundError,
    VLLMValidationError,
    sanitize_request_id,
    to_exception,
)
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import (
    STAGE_FAULTED_SECONDS,
    STAGE_RECOVERIES_TOTAL,
    STAGE_RECOVERY_WINDOW,
    StageStatus,
)
from vllm_omni.errors.sanitize import sanitize_message

__all__ = ["Recovery"]

logger = logging.getLogger(__name__)

# How long a recovery may take when its engine did not say (vLLM's default
# engine_recovery_timeout_sec): the engine gives up after it anyway.
_DEFAULT_RECOVERY_WINDOW_S = 120.0


class Recovery:
    """The stages' faults: who is faulted, what that refuses, which recovery
    runs (one per stage at a time)."""

    def __init__(
        self,
        handles: Mapping[int, StageHandle],
        channel: StageChannel,
        requests: RequestTable,
        *,
        serving: Callable[[], bool],
        mark_dead: Callable[[int, str], None],
        publish: Callable[[StageHandle], None],
        status_of: Callable[[StageHandle], StageStatus],
    ) -> None:
        self._handles = handles
        self._channel = channel
        self._requests = requests
        self._serving = serving
        self._mark_dead = mark_dead
        self._publish = publish
        self._status_of = status_of
        self.tasks: set[asyncio.Task[None]] = set()

    def on_engine_status(
        self, handle: StageHandle, raw: object, window_s: object
    ) -> None:
        """A stage reported its engine's fault-tolerance status (with its
        heartbeat, or asked in this process): act on the change it makes."""
        status = checked_status(raw)
        if status is None and handle.fault.status is None:
            return  # no fault tolerance: the usual heartbeat
        window = float(window_s) if isinstance(window_s, int | float) else None
        now = handle.now()
        change = handle.fault.report(status, window, now)
        if handle.fault.window_s is not None:
            STAGE_RECOVERY_WINDOW.labels(str(handle.config.id)).set(
                handle.fault.window_s
            )
        if change is not None:
            self._on_change(handle, change)
        if self._serving():
            self._publish(handle)
            self.watch(handle, now)

    def _on_change(self, handle: StageHandle, change: Change) -> None:
        """The stage's engine faulted (fail what it holds, refuse what needs
        it), recovered (admit again) or gave up (the engine is dead)."""
        stage_id, name = handle.config.id, handle.config.name
        if not self._serving():
            return
        if change == "dead":
            self._mark_dead(
                stage_id, "its engine faulted and did not recover (status dead)"
            )
            return
        if change == "recovered":
            STAGE_FAULTED_SECONDS.labels(str(stage_id)).set(0)
            logger.info(
                "stage %d (%s) recovered from its fault: admitting", stage_id, name
            )
            return
        # Not an abort anyone asked for: uncounted.
        failed = self._requests.fail_at_stage(
            stage_id,
            lambda: OmniServiceUnavailableError(
                f"Stage {stage_id} ({name}) faulted before the request "
                "finished. Please try again later or on a different instance.",
                stage_id=stage_id,
            ),
            None,
        )
        status = handle.fault.status or {}
        logger.warning(
            "stage %d (%s) faulted (engine %s, %s): %d request(s) in flight there "
            "fail with 503, new ones for it are refused with 503 until it recovers "
            "(recovery window %s)",
            stage_id,
            name,
            status.get("status"),
            status.get("fault_info", "no fault info"),
            failed,
            "unknown"
            if handle.fault.window_s is None
            else f"{handle.fault.window_s:g} s",
        )

    def watch(self, handle: StageHandle, now: float) -> None:
        """Each watch tick and status report: how long the stage has been
        faulted, and the recovery the server drives (``retry``, one at a
        time, the next after a backoff when one failed)."""
        if not handle.fault.faulted:
            return
        STAGE_FAULTED_SECONDS.labels(str(handle.config.id)).set(
            handle.fault.faulted_for(now)
        )
        if handle.fault.wants_recovery(now):
            self._start(handle, "retry", {}, recovery_request_id())

    def refuse(self, handle: StageHandle, request_id: str | None) -> None:
        """Raise the faulted record of ``handle``'s stage: a retryable 503
        naming it, ``Retry-After`` the rest of its recovery window (vLLM
        0.34's ``EngineFaultedError`` where it is defined)."""
        stage = handle.config
        details = OmniErrorDetails(
            sanitize_message(
                f"Stage {stage.id} ({stage.name}) has faulted and cannot accept "
                "new requests. Please try again later or on a different instance."
            ),
            "server",
            503,
            "ServiceUnavailableError",
            request_id=sanitize_request_id(request_id),
            stage_id=stage.id,
            faulted=True,
            retry_after_s=handle.fault.retry_after_s(handle.now()),
        )
        raise to_exception(details)

    def check_faulted(self) -> None:
        """Raise the faulted record of the first stage whose engine is
        faulted (``/health``); return while none is."""
        for handle in self._handles.values():
            if handle.fault.faulted:
                self.refuse(handle, None)

    def apply(
        self,
        stage_id: int,
        instruction: str,
        params: Mapping[str, Any],
        request_id: str,
    ) -> None:
        """Start a fault-tolerance instruction at a stage's engine (vLLM
        0.34's ``/v1/fault_tolerance/apply``); its result shows in
        ``status``. Raises when it cannot start: an unknown instruction
        (400), a stage without fault tolerance (404), a stage that is not
        waiting for one or is recovering already (409)."""
        if instruction not in INSTRUCTIONS:
            raise VLLMValidationError(
                f"instruction must be one of {', '.join(sorted(INSTRUCTIONS))}",
                parameter="instruction",
            )
        handle = self._handles.get(stage_id)
        if handle is None or handle.fault.status is None:
            tolerant = ", ".join(map(str, self.tolerant_stages())) or "none"
            raise VLLMNotFoundError(
                f"Stage {stage_id} has no engine that runs fault tolerance "
                f"(stages that have one: {tolerant})."
            )
        name = handle.config.name
        if handle.fault.recovering is not None:
            raise OmniConflictError(
                f"Stage {stage_id} ({name}) is recovering already; one recovery "
                "at a time."
            )
        if handle.fault.state != UNHEALTHY:
            raise OmniConflictError(
                f"Stage {stage_id} ({name}) is {handle.fault.state}: its engine "
                "takes an instruction only while it is unhealthy."
            )
        self._start(handle, instruction, dict(params), request_id)

    def _start(
        self,
        handle: StageHandle,
        instruction: str,
        params: dict[str, Any],
        request_id: str,
    ) -> None:
        handle.fault.begin(request_id)
        logger.info(
            "stage %d (%s): recovery %s started (%s)",
            handle.config.id,
            handle.config.name,
            request_id,
            instruction,
        )
        task = asyncio.create_task(
            self._recover(handle, instruction, params, request_id),
            name=f"omni-recovery-{handle.config.id}",
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _recover(
        self,
        handle: StageHandle,
        instruction: str,
        params: dict[str, Any],
        request_id: str,
    ) -> None:
        """Send the instruction through the stage's engine (its own
        ``handle_fault``) and wait for its answer, at most its window."""
        window = handle.fault.window_s or _DEFAULT_RECOVERY_WINDOW_S
        raw: object = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(window):
                if handle.inline is not None:
                    raw = await handle.inline.handle_fault(
                        instruction, params, request_id
                    )
                else:
                    raw = await self._channel.call(
                        handle,
                        "handle_fault",
                        {
                            "instruction": instruction,
                            "params": params,
                            "request_id": request_id,
                        },
                    )
        result = checked_result(raw, request_id)
        handle.fault.end(result, handle.now())
        outcome = "succeeded" if result["success"] else "failed"
        STAGE_RECOVERIES_TOTAL.labels(str(handle.config.id), outcome).inc()
        logger.log(
            logging.INFO if result["success"] else logging.WARNING,
            "stage %d (%s): recovery %s %s%s",
            handle.config.id,
            handle.config.name,
            request_id,
            outcome,
            f": {result['reason']}" if result["reason"] else "",
        )

    def tolerant_stages(self) -> list[int]:
        """The stages whose engine reported a fault-tolerance status."""
        return [sid for sid, h in self._handles.items() if h.fault.status is not None]

    def status(self) -> list[dict[str, Any]]:
        """Each stage's status as ``/v1/fault_tolerance/status`` shows it:
        the server's view (``status``), and for a stage whose engine runs
        fault tolerance its engine's own entry (vLLM 0.34's shape), window,
        current fault's length and recoveries."""
        now = asyncio.get_running_loop().time()
        stages = []
        for sid, handle in self._handles.items():
            fault = handle.fault
            entry: dict[str, Any] = {
                "stage_id": sid,
                "name": handle.config.name,
                "status": self._status_of(handle),
                "fault_tolerance": fault.status is not None,
            }
            if fault.status is not None:
                entry.update(
                    engines=[dict(fault.status)],
                    recovery_window_s=fault.window_s,
                    faulted_s=round(fault.faulted_for(now), 3),
                    recovering=fault.recovering,
                    last_recovery=fault.last_result,
                )
            stages.append(entry)
        return stages
