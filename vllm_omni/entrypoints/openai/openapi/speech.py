"""Narrowing ``POST /v1/audio/speech``: the talker's voices and speeds."""

from __future__ import annotations

from vllm_omni.entrypoints.openai.openapi.narrowing import (
    Domains,
    Pipeline,
    entries_domain,
    narrow_fields,
    request_body,
)
from vllm_omni.entrypoints.openai.openapi.schema import (
    accepted,
    like,
)
from vllm_omni.entrypoints.openai.protocol import SpeechRequest
from vllm_omni.entrypoints.openai.schema_errors import NOT_BLANK, Schema
from vllm_omni.stages import stage_range
from vllm_omni.stages.ranges import Choices, Numbers

__all__ = ["narrow_speech"]


def narrow_speech(doc: Schema, pipeline: Pipeline) -> None:
    schema = request_body(doc, "speech")
    domains: Domains = {
        "model": lambda s: pipeline.model_name(s, form=False),
        "input": lambda s: {**s, **NOT_BLANK},
        **pipeline.of_stage(
            {
                "voice": lambda s: {
                    **s,
                    "enum": list(stage_range("talker", "voice", Choices).values),
                },
                "speed": lambda s: like(
                    s, accepted(stage_range("talker", "speed", Numbers))
                ),
            }
        ),
        **entries_domain(pipeline),
    }
    narrow_fields(
        schema, "speech", pipeline.stages["audio"], domains, model=SpeechRequest
    )
