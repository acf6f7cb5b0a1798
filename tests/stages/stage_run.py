"""Run one reference stage in this process, without an engine."""

from __future__ import annotations

from typing import Any

from vllm_omni.config import load_pipeline
from vllm_omni.stages import build_stage
from vllm_omni.wire.messages import Payload, Submit

PIPELINE = load_pipeline("reference")


async def run(
    kind: str, prompt: str = "a red fox", inputs: Payload | None = None, **params: Any
) -> list[Payload]:
    stage_config = next(s for s in PIPELINE.stages if s.kind == kind)
    stage = build_stage(stage_config, PIPELINE)
    request = Submit(request_id="r", prompt=prompt, params=params, inputs=inputs)
    return [chunk async for chunk in stage.generate(request)]
