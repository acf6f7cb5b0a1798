"""Stage implementations and the registry that builds one from its config.

Maps ``kind`` to a class and what each kind publishes of itself (the
``params`` keys it reads; the values it accepts, ``ranges.py``), importing
the stage's module lazily in the process that runs it (docs/runtime.md §1).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from vllm_omni.config import PipelineConfig, StageConfig
    from vllm_omni.stages.base import Stage
    from vllm_omni.stages.ranges import ParamRange

__all__ = [
    "INLINE_KINDS",
    "ROUTE_PARAMS",
    "STAGE_KINDS",
    "STAGE_PARAMS",
    "build_stage",
    "check_stage_params",
    "entry_params",
    "stage_params",
    "stage_range",
    "stage_ranges",
]

STAGE_KINDS: dict[str, str] = {
    "text": "vllm_omni.stages.text:TextStage",
    "talker": "vllm_omni.stages.speech:TalkerStage",
    "vocoder": "vllm_omni.stages.speech:VocoderStage",
    "image": "vllm_omni.stages.image:ImageStage",
    "video": "vllm_omni.stages.video:VideoStage",
    "guardrail": "vllm_omni.stages.guardrail:GuardrailStage",
    "vllm": "vllm_omni.stages.vllm_backend:VLLMStage",
}


# Kinds cheap enough to run in the orchestrator's process instead of a stage
# process of their own (``vllm_omni.engine.inline``): no weights, no I/O,
# nothing to release, and a ``generate`` that never waits on anything, so a
# request pays no process hop for them. A check per request (the guardrail's
# blocklist) is a few microseconds; a hop there and back is hundreds.
INLINE_KINDS: frozenset[str] = frozenset({"guardrail"})


# The request ``params`` keys each kind reads: a key that no stage on a
# request's route reads is refused (400 naming it) before anything is sent,
# never dropped. A ``vllm`` stage also reads every keyword of upstream's
# ``SamplingParams`` (``stage_params`` adds them, importing vLLM only then).
STAGE_PARAMS: dict[str, frozenset[str]] = {
    "text": frozenset(
        {"max_tokens", "max_completion_tokens", "temperature", "seed", "stop", "n"}
    ),
    "talker": frozenset({"voice", "speed"}),
    "vocoder": frozenset(),
    "image": frozenset(
        {"n", "size", "seed", "image", "max_image_pixels", "max_image_frames"}
    ),
    "video": frozenset({"seconds", "size", "fps", "seed"}),
    "guardrail": frozenset(),
    "vllm": frozenset({"lora", "openai", "sampling_params"}),
}


def stage_params(kind: str) -> frozenset[str]:
    """The ``params`` keys a stage of ``kind`` reads."""
    keys = STAGE_PARAMS.get(kind, frozenset())
    if kind == "vllm":
        from vllm.sampling_params import SamplingParams

        keys = keys | frozenset(SamplingParams.__struct_fields__)
    return keys


# Keys only a route sets (the request it hands a ``vllm`` stage, an upload
# and the operator's limits on it): never a caller's per-stage entry.
ROUTE_PARAMS: frozenset[str] = frozenset(
    {"openai", "sampling_params", "image", "max_image_pixels", "max_image_frames"}
)


def entry_params(kind: str) -> frozenset[str]:
    """The keys a caller's per-stage entry for a stage of ``kind`` may set."""
    return stage_params(kind) - ROUTE_PARAMS


def _stage_class(kind: str) -> type[Stage]:
    target = STAGE_KINDS.get(kind)
    if target is None:
        raise RuntimeError(f"no stage implementation for kind {kind!r}")
    module_name, class_name = target.split(":")
    stage_class: type[Stage] = getattr(importlib.import_module(module_name), class_name)
    return stage_class


def check_stage_params(kind: str, params: Mapping[str, Any]) -> None:
    """Raise what a stage of ``kind`` would raise for ``params`` alone
    (``Stage.check_params``), importing its module only then."""
    _stage_class(kind).check_params(params)


def stage_ranges(kind: str) -> Mapping[str, ParamRange] | None:
    """The values a stage of ``kind`` accepts per ``params`` key it checks
    (``Stage.RANGES``), importing its module only then; ``None`` where
    upstream checks them."""
    return _stage_class(kind).RANGES


R = TypeVar("R")


def stage_range(kind: str, name: str, of: type[R]) -> R:
    """What a stage of ``kind`` accepts for ``name``, which must be an ``of``
    (``RuntimeError`` otherwise: the caller's reading is out of date)."""
    value = (stage_ranges(kind) or {}).get(name)
    if not isinstance(value, of):
        raise RuntimeError(f"a {kind} stage publishes no {of.__name__} for {name!r}")
    return value


def build_stage(config: StageConfig, pipeline: PipelineConfig) -> Stage:
    """Instantiate the stage implementation for ``config.kind``."""
    return _stage_class(config.kind)(config, pipeline)
