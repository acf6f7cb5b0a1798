"""A whole pipeline: its stages, guardrail, drills, backend and liveness.

The top-level keys of a pipeline file (docs/serving.md, "Pipeline files").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vllm_omni.config.fault import FaultConfig
from vllm_omni.config.stage import StageConfig

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "DEFAULT_RAY_PROBE_INTERVAL_S",
    "DEFAULT_RAY_PROBE_TIMEOUT_S",
    "DEFAULT_SILENCE_TIMEOUT_S",
    "HEARTBEAT_INTERVAL_S",
    "PipelineConfig",
    "WorkerBackend",
]

WorkerBackend = Literal["multi_process", "ray"]
"""Where the stages run: local processes, or Ray actors."""

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


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """A validated pipeline: the model name, its stages, guardrail and faults."""

    model: str
    """The model name clients send and ``/v1/models`` lists."""
    stages: tuple[StageConfig, ...]
    """At least one; ids unique."""
    guardrail_blocklist: tuple[str, ...] = ()
    """``guardrail.blocklist``: terms the ``guardrail`` stage refuses (400)."""
    faults: tuple[FaultConfig, ...] = ()
    """Fault drills, for drills and tests only."""
    source: str = "<memory>"
    """Where it was read from (a file path, ``builtin:NAME``, ``model:NAME``)."""
    worker_backend: WorkerBackend = "multi_process"
    """Where the stages run."""
    ray_address: str | None = None
    """The Ray cluster to join; None: a local instance."""
    stage_init_timeout_s: float = 120.0
    """How long each stage's Ray placement and actor start may take."""
    ray_probe_interval_s: float = DEFAULT_RAY_PROBE_INTERVAL_S
    """``ray.probe_interval_s``: how often the request-time probe pings every
    stage actor and the GCS."""
    ray_probe_timeout_s: float = DEFAULT_RAY_PROBE_TIMEOUT_S
    """``ray.probe_timeout_s``: an actor or the GCS silent this long fails
    its requests (504) and refuses new ones (503)."""
    orchestrator_address: tuple[str, int] | None = None
    """Where the orchestrator binds tcp for stages on other hosts: (host,
    port); None: ``ipc://``, local only."""
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    """A stage on another host not heard from this long: the engine is dead."""
    silence_timeout_s: float | None = None
    """A stage on another host not heard from this long: silent (504 held,
    503 needed). As written; None: the default (``liveness_settings``)."""
    otlp_traces_endpoint: str | None = None
    """Where every process of the engine exports its spans
    (``--otlp-traces-endpoint``; None: each process's OTEL_* environment).
    Set by the engine (``with_traces_endpoint``), not read from a file."""

    def stage(self, stage_id: int) -> StageConfig:
        """The stage whose id is ``stage_id`` (``RuntimeError`` if none)."""
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise RuntimeError(f"pipeline has no stage {stage_id}")

    def faults_for(self, stage_id: int) -> tuple[FaultConfig, ...]:
        """The drills aimed at stage ``stage_id``."""
        return tuple(f for f in self.faults if f.stage == stage_id)
