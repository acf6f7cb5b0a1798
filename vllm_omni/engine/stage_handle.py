"""The orchestrator's view of one stage, and what a worker backend promises."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Protocol

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine.fault_tolerance import StageFault
from vllm_omni.engine.inline import InlineStage
from vllm_omni.engine.processes import StageProcess
from vllm_omni.engine.stage_worker import stage_identity
from vllm_omni.errors import OmniServiceUnavailableError, normalize
from vllm_omni.wire import messages as m

__all__ = ["LauncherHooks", "StageHandle", "StageLauncher", "StageStartupError"]


class StageStartupError(OmniServiceUnavailableError):
    """A stage could not start: the engine never ran (503, with ``stage_id``).

    The message names the stage and the cause, for example ``Stage 7 (gpu)
    failed to start: ValidationError: 1 validation error for EngineArgs``.
    """

    def __init__(self, stage: StageConfig, cause: str) -> None:
        super().__init__(f"Stage {stage.id} ({stage.name}) failed to start: {cause}")
        self.stage_id = stage.id
        self.cause = cause
        self.details = normalize(self, stage_id=stage.id)


class StageHandle:
    """One stage as the orchestrator sees it: its process, identity and health."""

    def __init__(self, config: StageConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.identity = stage_identity(config.id)
        self.process: StageProcess | None = None
        self.ready: asyncio.Future[m.Ready] = loop.create_future()
        self.pid: int | None = None
        self.last_seen = loop.time()
        # Why it is silent: "heartbeat" (not heard from for silence_timeout_s)
        # and/or "probe" (its launcher's probe got no answer). While either
        # holds, requests for it are refused.
        self.silent_by: set[str] = set()
        # Set when the stage runs in this process (``engine.inline``).
        self.inline: InlineStage | None = None
        # Its engine's fault tolerance, as the stage reports it.
        self.fault = StageFault()

    @property
    def silent(self) -> bool:
        return bool(self.silent_by)

    def now(self) -> float:
        """The time on the engine's loop."""
        return self.ready.get_loop().time()


@dataclasses.dataclass(frozen=True, slots=True)
class LauncherHooks:
    """What a launcher reports to the orchestrator, always on its loop.

    ``exited(stage_id, reason)``: the stage stopped for good (the
    orchestrator decides whether that is a death). ``answering(stage_id,
    ok)``: the stage's liveness probe failed (``False``) or answered again
    (``True``). ``reachable(ok)``: the same for the backend's control plane.
    The probes report changes only; ``reason`` goes to the log, never to a
    client.
    """

    exited: Callable[[int, str], None]
    answering: Callable[[int, bool], None]
    reachable: Callable[[bool], None]


class StageLauncher(Protocol):
    """A worker backend beside local processes: starts stages elsewhere.

    ``prepare`` connects to the backend and returns the host stages reach the
    orchestrator at; ``launch`` starts every stage against ``address`` and
    reports through ``hooks`` until ``stop``, which releases it all.
    """

    def prepare(self) -> str: ...

    async def launch(
        self,
        pipeline: PipelineConfig,
        address: str,
        hooks: LauncherHooks,
    ) -> None: ...

    def stop(self, timeout_s: float) -> None: ...
