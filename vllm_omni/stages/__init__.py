"""Stage implementations and the registry that builds one from its config.

Owns the mapping ``kind → class`` and the ``Stage`` contract every
implementation follows (``base.py``). Stage modules are imported lazily by
``build_stage`` inside the stage process, so the orchestrator never pays for
Pillow, numpy or vLLM's engine just to route requests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_omni.config import PipelineConfig, StageConfig
    from vllm_omni.stages.base import Stage

__all__ = ["STAGE_KINDS", "build_stage"]

STAGE_KINDS: dict[str, str] = {
    "text": "vllm_omni.stages.text:TextStage",
    "talker": "vllm_omni.stages.speech:TalkerStage",
    "vocoder": "vllm_omni.stages.speech:VocoderStage",
    "image": "vllm_omni.stages.image:ImageStage",
    "video": "vllm_omni.stages.video:VideoStage",
    "guardrail": "vllm_omni.stages.guardrail:GuardrailStage",
    "vllm": "vllm_omni.stages.vllm_backend:VLLMStage",
}


def build_stage(config: StageConfig, pipeline: PipelineConfig) -> Stage:
    """Instantiate the stage implementation for ``config.kind``."""
    target = STAGE_KINDS.get(config.kind)
    if target is None:
        raise RuntimeError(f"no stage implementation for kind {config.kind!r}")
    module_name, class_name = target.split(":")
    stage_class = getattr(importlib.import_module(module_name), class_name)
    return stage_class(config, pipeline)
