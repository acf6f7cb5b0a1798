"""Watches the stages of a running engine: their processes, heartbeats,
silence and launcher probes (docs/design.md §6)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from vllm_omni.config import HEARTBEAT_INTERVAL_S, StageConfig
from vllm_omni.engine import liveness
from vllm_omni.engine.recovery import Recovery
from vllm_omni.engine.request_table import RequestTable
from vllm_omni.engine.stage_channel import StageChannel
from vllm_omni.engine.stage_handle import StageHandle
from vllm_omni.errors import (
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    fatal_reason,
)
from vllm_omni.errors.metrics import EVENT_LOOP_LAG
from vllm_omni.wire import messages as m

__all__ = ["StageWatch"]

logger = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.1


class StageWatch:
    """Hears the stages: a stage process that exited, a stage in this process
    whose engine died, heartbeats lost (dead) or late (silent), a launcher's
    probes and control plane. Deaths go to ``mark_dead``; a silent stage fails
    what it holds (504) and refuses what needs it (503) until heard again."""

    def __init__(
        self,
        handles: Mapping[int, StageHandle],
        channel: StageChannel,
        requests: RequestTable,
        recovery: Recovery,
        *,
        launched: bool,
        heartbeat_timeout_s: float,
        silence_timeout_s: float | None,
        death_grace_s: float,
        serving: Callable[[], bool],
        mark_dead: Callable[[int, str], None],
        publish: Callable[[StageHandle], None],
    ) -> None:
        self._handles = handles
        self._channel = channel
        self._requests = requests
        self._recovery = recovery
        # Launched stages may be on other hosts: heard by their heartbeats.
        self._launched = launched
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # None: a stage is never silent, only dead after heartbeat_timeout_s.
        self.silence_timeout_s = silence_timeout_s
        self._death_grace_s = death_grace_s
        self._serving = serving
        self._mark_dead = mark_dead
        self._publish = publish
        # The launcher's control plane does not answer: admission refuses.
        self.unreachable = False
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        """Every tick until the engine is dead or closed: each stage's health,
        and heartbeats to the stages watched by them."""
        loop = asyncio.get_running_loop()
        next_beat = previous = loop.time()
        while self._serving():
            await asyncio.sleep(_WATCH_INTERVAL_S)
            now = loop.time()
            EVENT_LOOP_LAG.observe(max(0.0, now - previous - _WATCH_INTERVAL_S))
            paused = liveness.stalled(previous, now, _WATCH_INTERVAL_S)
            previous = now
            if paused:
                # Not the stages' silence: see ``liveness``.
                logger.warning(
                    "the orchestrator did not run for %.1f s (process or machine "
                    "paused); stage silence over that time is not counted",
                    paused,
                )
                for handle in self._handles.values():
                    handle.last_seen = liveness.credited(handle.last_seen, paused, now)
            for handle in self._handles.values():
                if await self._watch_one(handle, now):
                    return
            if now >= next_beat:
                next_beat = now + HEARTBEAT_INTERVAL_S
                for handle in self._handles.values():
                    if self._watched_by_heartbeat(handle):
                        self._channel.post(handle, m.Heartbeat())

    async def _watch_one(self, handle: StageHandle, now: float) -> bool:
        """One tick for one stage; True once the engine is dead."""
        death = handle.inline.health() if handle.inline is not None else None
        if death is not None:
            # In this process: its engine died (no process to exit).
            self._mark_dead(handle.config.id, fatal_reason(death))
            return True
        if handle.inline is not None:
            self._recovery.on_engine_status(handle, *handle.inline.fault_status())
            if not self._serving():
                return True
        self._recovery.watch(handle, now)
        process = handle.process
        if process is not None and not process.is_alive():
            # Let the receiver deliver a fatal record sent just before exit.
            await asyncio.sleep(self._death_grace_s)
            self._mark_dead(
                handle.config.id, f"stage process exited with code {process.exitcode}"
            )
            return True
        if self._watched_by_heartbeat(handle) and handle.ready.done():
            unheard = now - handle.last_seen
            if unheard > self.heartbeat_timeout_s:
                self._mark_dead(handle.config.id, "stage heartbeat lost")
                return True
            if self.silence_timeout_s is not None:
                self._set_silent(
                    handle,
                    "heartbeat",
                    unheard > self.silence_timeout_s,
                    f"not heard from for {unheard:.1f} s",
                )
        return False

    def _watched_by_heartbeat(self, handle: StageHandle) -> bool:
        return handle.config.remote or self._launched

    def on_exit(self, stage_id: int, reason: str) -> None:
        """A launched stage stopped (the launcher's liveness source)."""

        async def mark() -> None:
            # Let the receiver deliver a fatal record sent just before exit.
            await asyncio.sleep(self._death_grace_s)
            self._mark_dead(stage_id, reason)

        self.tasks.append(asyncio.create_task(mark(), name=f"omni-exit-{stage_id}"))

    def on_answering(self, stage_id: int, answering: bool) -> None:
        """A launched stage's probe changed (docs/design.md §6)."""
        self._set_silent(
            self._handles[stage_id], "probe", not answering, "its probe got no answer"
        )

    def _set_silent(
        self, handle: StageHandle, source: str, silent: bool, why: str
    ) -> None:
        """``source`` says the stage is silent (or no longer); on the change of
        the stage's state, fail what it holds, or admit again."""
        was = handle.silent
        if silent:
            handle.silent_by.add(source)
        else:
            handle.silent_by.discard(source)
        if handle.silent == was or not self._serving():
            return
        self._publish(handle)
        stage_id, name = handle.config.id, handle.config.name
        if not silent:
            logger.info("stage %d (%s) answers again: admitting", stage_id, name)
            return
        failed = self._requests.fail_at_stage(
            stage_id,
            lambda: OmniStageTimeoutError(
                f"Stage {stage_id} ({name}) stopped answering.", stage_id=stage_id
            ),
            "timeout",
        )
        logger.warning(
            "stage %d (%s) does not answer (%s): %d request(s) in flight there "
            "fail with 504, new ones for it are refused with 503",
            stage_id,
            name,
            why,
            failed,
        )

    def on_reachable(self, reachable: bool) -> None:
        """The launcher's control plane changed (docs/design.md §6)."""
        if self.unreachable is not reachable:
            return
        self.unreachable = not reachable
        if reachable:
            logger.info("the stages' cluster answers again: admitting")
        else:
            logger.warning(
                "the stages' cluster does not answer: new requests are refused "
                "with 503, admitted ones go on"
            )

    # -- admission checks ------------------------------------------------------

    def check_reachable(self, first: StageConfig) -> None:
        """Refuse a new request while the launcher's control plane is down."""
        if self.unreachable:
            raise OmniServiceUnavailableError(
                f"Stage {first.id} ({first.name}) cannot be reached; retry later.",
                stage_id=first.id,
            )

    def check_answering(self, stage: StageConfig, request_id: str | None) -> None:
        """Refuse a request that needs ``stage`` while the stage is silent
        (503) or its engine faulted (``Recovery.refuse``)."""
        handle = self._handles[stage.id]
        if handle.silent:
            raise OmniServiceUnavailableError(
                f"Stage {stage.id} ({stage.name}) is not answering; retry later.",
                stage_id=stage.id,
            )
        if handle.fault.faulted:
            self._recovery.refuse(handle, request_id)
