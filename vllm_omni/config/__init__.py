"""Pipeline configuration: the YAML that says which stages a pipeline runs.

The schema, one configuration a module (``stage``, ``fault``, ``pipeline``),
its checks (``validation``), reading it (``loading``) and the pipeline a
model runs in (``resolution``). The keys are documented in docs/serving.md,
"Pipeline files". Cheap to import (no vLLM); it starts nothing and imports
nothing of the engine, stages or entry points (docs/design.md §1).
"""

from vllm_omni.config.fault import (
    FAULT_EXCEPTION_MODULES,
    FaultAction,
    FaultConfig,
    resolve_exception,
)
from vllm_omni.config.loading import (
    BUILTIN_PIPELINES,
    check_pipeline,
    load_pipeline,
    pipeline_from_mapping,
)
from vllm_omni.config.pipeline import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_RAY_PROBE_INTERVAL_S,
    DEFAULT_RAY_PROBE_TIMEOUT_S,
    DEFAULT_SILENCE_TIMEOUT_S,
    HEARTBEAT_INTERVAL_S,
    PipelineConfig,
    WorkerBackend,
)
from vllm_omni.config.resolution import (
    MODEL_STAGE_NAME,
    check_model_pipeline,
    pipeline_for_model,
    with_traces_endpoint,
)
from vllm_omni.config.stage import RayStageOptions, StageConfig, StageKind
from vllm_omni.config.validation import PipelineConfigError, liveness_settings

__all__ = [
    "BUILTIN_PIPELINES",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "DEFAULT_RAY_PROBE_INTERVAL_S",
    "DEFAULT_RAY_PROBE_TIMEOUT_S",
    "DEFAULT_SILENCE_TIMEOUT_S",
    "FAULT_EXCEPTION_MODULES",
    "HEARTBEAT_INTERVAL_S",
    "MODEL_STAGE_NAME",
    "FaultAction",
    "FaultConfig",
    "PipelineConfig",
    "PipelineConfigError",
    "RayStageOptions",
    "StageConfig",
    "StageKind",
    "WorkerBackend",
    "check_model_pipeline",
    "check_pipeline",
    "liveness_settings",
    "load_pipeline",
    "pipeline_for_model",
    "pipeline_from_mapping",
    "resolve_exception",
    "with_traces_endpoint",
]
