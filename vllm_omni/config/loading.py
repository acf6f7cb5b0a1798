"""Reading a pipeline: the built-in ``reference``, a YAML file, or a mapping.

``check_pipeline`` is the check ``vllm-omni serve`` runs before it imports
vLLM (``PipelineConfigError``: ``file:line:column`` for YAML, the key path
for the schema); ``load_pipeline`` and ``pipeline_from_mapping`` are the same
for Python callers (``VLLMValidationError``).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import yaml

from vllm_omni.config.pipeline import PipelineConfig
from vllm_omni.config.validation import (
    PipelineConfigError,
    as_validation_error,
    validate_pipeline,
)

__all__ = [
    "BUILTIN_PIPELINES",
    "check_pipeline",
    "load_pipeline",
    "pipeline_from_mapping",
]

BUILTIN_PIPELINES = ("reference",)
"""The pipelines shipped in ``vllm_omni/pipelines/`` (NAME.yaml), by name."""


def pipeline_from_mapping(data: object, *, source: str = "<memory>") -> PipelineConfig:
    """Validate an already parsed pipeline document (``VLLMValidationError``)."""
    with as_validation_error():
        return validate_pipeline(data, source=source, build_faults=True)


def check_pipeline(
    spec: str | os.PathLike[str], *, build_faults: bool = True
) -> PipelineConfig:
    """Load ``reference`` or a YAML file; raise ``PipelineConfigError`` if bad.

    With ``build_faults=False`` nothing imports vLLM (fault exception classes
    are checked later, by ``load_pipeline``), so a CLI can check a file in
    milliseconds before it pays for vLLM.
    """
    if isinstance(spec, str) and spec in BUILTIN_PIPELINES:
        text = (resources.files("vllm_omni.pipelines") / f"{spec}.yaml").read_text()
        source = f"builtin:{spec}"
    else:
        path = Path(spec)
        source = str(path)
        if not path.exists():
            raise PipelineConfigError(
                f"pipeline file {source} does not exist "
                f"(built-in pipelines: {', '.join(BUILTIN_PIPELINES)})",
                "pipeline",
            )
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PipelineConfigError(
                f"cannot read pipeline file {source}: "
                f"{getattr(exc, 'strerror', None) or type(exc).__name__}",
                "pipeline",
            ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source) from None
    try:
        return validate_pipeline(data, source=source, build_faults=build_faults)
    except PipelineConfigError as exc:
        raise PipelineConfigError(exc.message, exc.parameter, source=source) from None


def _yaml_error(exc: yaml.YAMLError, source: str) -> PipelineConfigError:
    """``file:line:column: message``, the position of the problem (1-based)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    where = source if mark is None else f"{source}:{mark.line + 1}:{mark.column + 1}"
    return PipelineConfigError(f"not valid YAML: {problem}", "pipeline", source=where)


def load_pipeline(spec: str | os.PathLike[str] | PipelineConfig) -> PipelineConfig:
    """``reference`` (built in), a YAML file path, or an already loaded config.

    Raises ``VLLMValidationError`` naming the key path (``parameter``).
    """
    if isinstance(spec, PipelineConfig):
        return spec
    with as_validation_error():
        return check_pipeline(spec)
