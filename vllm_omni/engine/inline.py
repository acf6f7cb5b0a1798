"""Stages that run in the orchestrator's process: the stage contract, no hop.

A stage of a kind in ``vllm_omni.stages.INLINE_KINDS`` (the guardrail)
runs here instead of in a stage process of its own, when the engine runs
its stages as local processes and nothing asks for one (not ``remote``, no
fault drill aimed at it): its work is a few microseconds, a process hop
there and back is hundreds. Everything a stage process does for a request
is done here the same way (``stage_worker``):

- what the stage raises is normalized here, with ``normalize(exc,
  request_id=..., stage_id=...)`` in strict mode, into the same record a
  stage process would send (a ``CancelledError`` the stage raises on its
  own, nobody cancelling, is a failure like any other), logged with the
  same line (``log_failure``); the orchestrator rebuilds it with
  ``to_exception``, as it does a record off the wire;
- an abort is logged with the same line (``log_abort``) and counted;
- its log lines are a stage process's (``stage_logger``): stamped with the
  stage and request ids, one write each to stderr, at the level and with
  the tracebacks the engine's process would show, credentials redacted;
- ``stats`` answers what a stage process answers (``StageStats``), with this
  process's pid.

The orchestrator runs a request through it in the request's own task,
between the stages on either side (``Orchestrator._run``). That is why only
kinds whose ``generate`` never waits may be inline: nothing can preempt
it, and there is nothing to cancel. This module must not decide statuses or
build envelopes, and must not rebuild exceptions from records.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vllm_omni.config import PipelineConfig, StageConfig
from vllm_omni.engine import hops
from vllm_omni.engine import messages as m
from vllm_omni.engine.stage_worker import (
    StageStats,
    log_abort,
    log_failure,
    stage_logger,
)
from vllm_omni.errors import normalize
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.stages import INLINE_KINDS, build_stage

__all__ = ["Failure", "InlineStage", "runs_inline"]

# A request's failure in an inline stage: its record, and what was raised.
Failure = tuple[OmniErrorDetails, BaseException]


def runs_inline(stage: StageConfig, pipeline: PipelineConfig, local: bool) -> bool:
    """Whether ``stage`` runs in the orchestrator's process: an inline kind,
    on an engine whose stages are local processes (``local``), not started
    by an operator elsewhere, and no fault drill aimed at it (a drill may
    exit or hang its process)."""
    return (
        local
        and stage.kind in INLINE_KINDS
        and not stage.remote
        and not pipeline.faults_for(stage.id)
    )


class InlineStage:
    """One stage served in the orchestrator's process."""

    def __init__(
        self,
        config: StageConfig,
        pipeline: PipelineConfig,
        *,
        log_level: int,
        log_tracebacks: bool,
    ) -> None:
        self.config = config
        self._stage = build_stage(config, pipeline)
        self._stats = StageStats()
        self._active: set[str] = set()
        self._log = stage_logger(config.id, log_level, log_tracebacks)

    async def start(self) -> None:
        await self._stage.start()

    async def run(self, request: m.Submit) -> tuple[list[m.Payload], Failure | None]:
        """Run one request: its payloads, or the failure's record and the
        exception (for the orchestrator's log of a fatal one)."""
        stage_id = self.config.id
        request_id = request.request_id
        hops.mark(request_id, "stage.started", stage_id)
        self._stats.submitted += 1
        self._active.add(request_id)
        payloads: list[m.Payload] = []
        try:
            async for payload in self._stage.generate(request):
                hops.mark(request_id, "stage.payload", stage_id)
                payloads.append(payload)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the request's consumer went away: no record
            return [], self._fail(request_id, exc)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # every other failure becomes a record
            return [], self._fail(request_id, exc)
        finally:
            self._active.discard(request_id)
        self._stats.completed += 1
        hops.mark(request_id, "stage.finished", stage_id)
        return payloads, None

    def _fail(self, request_id: str, exc: BaseException) -> Failure:
        hops.mark(request_id, "stage.failing", self.config.id)
        self._stats.failed += 1
        details = normalize(exc, request_id=request_id, stage_id=self.config.id)
        log_failure(self.config.id, request_id, details, exc, self._log)
        hops.mark(request_id, "stage.failed", self.config.id)
        return details, exc

    def abort(self, request_id: str) -> None:
        """An abort reached this stage (its work never runs past one step)."""
        self._stats.aborts.append(request_id)
        log_abort(self.config.id, request_id, False, self._log)

    def utility(self, method: str) -> Any:
        """What a stage process answers to a utility call (``hops``: nothing,
        this process's marks are the orchestrator's)."""
        if method == "stats":
            return self._stats.report(self.config, self._active, compact=True)
        if method == "hops":
            return []
        return {"error": f"unknown utility {method!r}"}
