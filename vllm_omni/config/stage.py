"""One stage of a pipeline: what it runs, where, and how long it may take.

The keys of ``stages[N]`` (docs/serving.md, "Pipeline files").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["RayStageOptions", "StageConfig", "StageKind"]

StageKind = Literal["text", "talker", "vocoder", "image", "video", "guardrail", "vllm"]
"""What a stage runs: the implementation ``vllm_omni.stages.STAGE_KINDS`` names."""


@dataclass(frozen=True, slots=True)
class RayStageOptions:
    """Where a stage's Ray actor may be placed (``worker_backend: ray`` only)."""

    # Reference stages are light; a stage that needs a CPU or GPU of its own
    # says so, like upstream actors that reserve nothing unless asked.
    num_cpus: float = 0.0
    """CPUs the actor reserves."""
    num_gpus: float = 0.0
    """GPUs the actor reserves."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom resources it needs (a node started with ``--resources`` offers them)."""
    label_selector: Mapping[str, str] = field(default_factory=dict)
    """Node labels the actor must land on (``ray start --labels``)."""


@dataclass(frozen=True, slots=True)
class StageConfig:
    """One stage: what it runs and how long a request may take in it."""

    id: int
    """Unique in the pipeline, >= 0; records and logs name the stage by it."""
    name: str
    """Its name in messages and logs (``Stage 1 (thinker)``); a fault may name
    the stage by it. Written as absent: the kind."""
    kind: StageKind
    """The implementation it runs."""
    timeout_s: float | None = None
    """How long a request may stay in this stage (504 past it); None: no limit."""
    max_num_queued_reqs: int | None = None
    """Requests this stage may hold at once; one more handed to it is refused
    with ``QueueOverflowError`` (503). None: only the engine's limit applies."""
    remote: bool = False
    """Started by an operator on another host; the orchestrator only waits for it."""
    legacy_wire: bool = False
    """Send errors with only the 0.30 flat fields (for a strict old orchestrator)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The kind's own settings (a ``vllm`` stage's ``engine_args``)."""
    ray: RayStageOptions = field(default_factory=RayStageOptions)
    """Its actor's placement under the Ray backend."""
    in_process: bool | None = None
    """Run in the orchestrator's process instead of a process of its own; None:
    the kind's default (``vllm_omni.stages.INLINE_KINDS``)."""
