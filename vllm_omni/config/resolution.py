"""The pipeline a model runs in: ``vllm serve MODEL --omni``, ``Omni(model=...)``.

A model with no pipeline file gets one ``vllm`` stage; a model or engine
arguments given with a file go to its one ``vllm`` stage
(docs/serving.md, the first section). ``with_traces_endpoint`` points every
process of a pipeline at one span collector.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_omni.config.pipeline import PipelineConfig
from vllm_omni.config.stage import StageConfig
from vllm_omni.config.validation import (
    PipelineConfigError,
    as_validation_error,
    reject,
)

__all__ = [
    "MODEL_STAGE_NAME",
    "check_model_pipeline",
    "pipeline_for_model",
    "with_traces_endpoint",
]

# The name of the one stage a model served without a pipeline file runs in.
MODEL_STAGE_NAME = "llm"


def check_model_pipeline(
    model: str | None,
    engine_args: Mapping[str, Any] | None = None,
    *,
    base: PipelineConfig | None = None,
    served_model_name: str | None = None,
) -> PipelineConfig:
    """The pipeline ``vllm serve MODEL --omni`` and ``Omni(model=...)`` run;
    ``PipelineConfigError`` if it cannot be built (see ``pipeline_for_model``).

    Without ``base``: one ``vllm`` stage (id 0, in the orchestrator's process
    as ``vllm serve`` runs its engine) built from ``model`` and the engine
    arguments. With ``base`` (a pipeline file): the model and engine arguments
    go to its one ``vllm`` stage, over what the file says; a pipeline with no
    ``vllm`` stage, or more than one, refuses them (naming the first
    argument: never silently dropped). ``served_model_name``
    (the name clients send) defaults to the file's ``model`` or to ``model``.
    Imports nothing of vLLM: the engine arguments are checked by the stage.
    """
    given = dict(engine_args or {})
    if model is not None:
        if not isinstance(model, str) or not model:
            reject("model must be a non-empty string", "model")
        given["model"] = model
    if base is None:
        if model is None:
            reject("a model is needed when no pipeline is given", "model")
        stage = StageConfig(
            id=0,
            name=MODEL_STAGE_NAME,
            kind="vllm",
            in_process=True,
            options={"engine_args": given},
        )
        return PipelineConfig(
            model=served_model_name or model or "",
            stages=(stage,),
            source=f"model:{model}",
        )
    if not given:
        if served_model_name is None:
            return base
        return replace(base, model=served_model_name)
    targets = [s for s in base.stages if s.kind == "vllm"]
    if len(targets) != 1:
        first = "model" if "model" in given else next(iter(given))
        why = (
            "has no vllm stage to give it to"
            if not targets
            else f"has {len(targets)} vllm stages; name the one in its file"
        )
        raise PipelineConfigError(
            f"{first} cannot be used with pipeline {base.source}: it {why}", first
        )
    (target,) = targets
    old = target.options.get("engine_args", {})
    merged = {**(old if isinstance(old, Mapping) else {}), **given}
    stage = replace(target, options={**target.options, "engine_args": merged})
    return replace(
        base,
        model=served_model_name or base.model,
        stages=tuple(stage if s is target else s for s in base.stages),
    )


def with_traces_endpoint(
    pipeline: PipelineConfig, endpoint: str | None
) -> PipelineConfig:
    """``pipeline`` whose processes export spans to ``endpoint``: every stage
    process (``otlp_traces_endpoint``) and every ``vllm`` stage's engine
    (its ``otlp_traces_endpoint`` engine argument, unless the file sets one:
    upstream drops ``trace_headers`` without it)."""
    if endpoint is None:
        return pipeline
    stages = []
    for stage in pipeline.stages:
        engine_args = stage.options.get("engine_args")
        if stage.kind == "vllm" and isinstance(engine_args, Mapping):
            engine_args = {"otlp_traces_endpoint": endpoint, **engine_args}
            stage = replace(
                stage, options={**stage.options, "engine_args": engine_args}
            )
        stages.append(stage)
    return replace(pipeline, stages=tuple(stages), otlp_traces_endpoint=endpoint)


def pipeline_for_model(
    model: str | None,
    engine_args: Mapping[str, Any] | None = None,
    *,
    base: PipelineConfig | None = None,
    served_model_name: str | None = None,
) -> PipelineConfig:
    """``check_model_pipeline`` for Python callers: ``VLLMValidationError``
    naming the argument."""
    with as_validation_error():
        return check_model_pipeline(
            model, engine_args, base=base, served_model_name=served_model_name
        )
