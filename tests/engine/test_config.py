"""Pipeline YAML: the built-in reference loads; a bad file names its bad key."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import vllm_omni.config
import vllm_omni.engine.faults
from tests.engine.engines import write_pipeline
from vllm_omni.config import (
    PipelineConfigError,
    check_pipeline,
    load_pipeline,
    pipeline_from_mapping,
)
from vllm_omni.errors import VLLMValidationError

GOOD: dict[str, Any] = {
    "model": "m",
    "stages": [{"id": 0, "name": "thinker", "kind": "text", "timeout_s": 2}],
}


def test_reference_pipeline_is_built_in() -> None:
    pipeline = load_pipeline("reference")
    assert pipeline.model == "omni-reference"
    kinds = [stage.kind for stage in pipeline.stages]
    assert kinds == ["guardrail", "text", "talker", "vocoder", "image", "video"]
    assert pipeline.guardrail_blocklist and not pipeline.faults


def test_a_file_path_selects_another_pipeline(tmp_path: Path) -> None:
    document = {
        **GOOD,
        "faults": [{"stage": "thinker", "marker": "@x", "action": "exit"}],
    }
    pipeline = load_pipeline(write_pipeline(tmp_path, document))
    assert pipeline.model == "m" and pipeline.stages[0].timeout_s == 2.0
    assert pipeline.stages[0].max_num_queued_reqs is None
    assert pipeline.faults_for(0)[0].action == "exit"


def test_a_stage_admission_limit_is_read() -> None:
    pipeline = pipeline_from_mapping(_with_stage(max_num_queued_reqs=3))
    assert pipeline.stages[0].max_num_queued_reqs == 3


def _with_stage(**changes: Any) -> dict[str, Any]:
    return {**GOOD, "stages": [{**GOOD["stages"][0], **changes}]}


@pytest.mark.parametrize(
    ("document", "parameter"),
    [
        ([], "pipeline"),
        ({"stages": GOOD["stages"]}, "model"),
        ({**GOOD, "extra": 1}, "extra"),
        ({**GOOD, "stages": []}, "stages"),
        (_with_stage(kind="teleport"), "stages[0].kind"),
        (_with_stage(id=-1), "stages[0].id"),
        (_with_stage(timeout_s=0), "stages[0].timeout_s"),
        (_with_stage(timeout_s=True), "stages[0].timeout_s"),
        (_with_stage(max_num_queued_reqs=0), "stages[0].max_num_queued_reqs"),
        (_with_stage(max_num_queued_reqs=2.5), "stages[0].max_num_queued_reqs"),
        (_with_stage(max_num_queued_reqs=True), "stages[0].max_num_queued_reqs"),
        (_with_stage(colour="red"), "stages[0].colour"),
        (_with_stage(remote="yes"), "stages[0].remote"),
        ({**GOOD, "stages": GOOD["stages"] * 2}, "stages"),
        ({**GOOD, "guardrail": {"blocklist": "x"}}, "guardrail.blocklist"),
        (
            {**GOOD, "faults": [{"stage": 9, "marker": "m", "action": "raise"}]},
            "faults[0].stage",
        ),
        (
            {**GOOD, "faults": [{"stage": 0, "marker": "", "action": "raise"}]},
            "faults[0].marker",
        ),
        (
            {**GOOD, "faults": [{"stage": 0, "marker": "m", "action": "melt"}]},
            "faults[0].action",
        ),
        (
            {
                **GOOD,
                "faults": [
                    {
                        "stage": 0,
                        "marker": "m",
                        "action": "exit",
                        "exception": "RuntimeError",
                    }
                ],
            },
            "faults[0].exception",
        ),
    ],
)
def test_bad_config_names_the_key(document: Any, parameter: str) -> None:
    with pytest.raises(VLLMValidationError) as info:
        pipeline_from_mapping(document)
    assert info.value.parameter == parameter
    assert "invalid pipeline config" in str(info.value)


def test_missing_file_says_the_file_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(VLLMValidationError) as info:
        load_pipeline(missing)
    assert str(info.value).startswith(f"pipeline file {missing} does not exist")
    assert info.value.parameter == "pipeline"


def test_bad_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\nstages:\n  - {id: 0, kind: text\n")
    with pytest.raises(PipelineConfigError) as info:
        check_pipeline(bad)
    # The flow mapping opened on line 3 is never closed; PyYAML marks the end.
    assert str(info.value) == (
        f"{bad}:4:1: not valid YAML: expected ',' or '}}', but got '<stream end>'"
    )
    with pytest.raises(VLLMValidationError, match=f"^{bad}:4:1: not valid YAML"):
        load_pipeline(bad)


def test_schema_error_in_a_file_names_file_and_key_path(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, _with_stage(kind="teleport"))
    with pytest.raises(PipelineConfigError) as info:
        check_pipeline(path)
    assert info.value.parameter == "stages[0].kind"
    assert str(info.value).startswith(
        f"{path}: invalid pipeline config at stages[0].kind: stage kind must be"
    )


def test_blocklist_without_a_guardrail_stage_is_rejected() -> None:
    with pytest.raises(VLLMValidationError) as info:
        pipeline_from_mapping({**GOOD, "guardrail": {"blocklist": ["x"]}})
    assert info.value.parameter == "guardrail.blocklist"
    assert "needs a stage of kind 'guardrail'" in str(info.value)
    guarded = {
        **GOOD,
        "stages": [{"id": 0, "kind": "guardrail"}, {"id": 1, "kind": "text"}],
        "guardrail": {"blocklist": ["x"]},
    }
    assert pipeline_from_mapping(guarded).guardrail_blocklist == ("x",)


def _raising(**fault: Any) -> dict[str, Any]:
    return {
        **GOOD,
        "faults": [{"stage": 0, "marker": "@x", "action": "raise", **fault}],
    }


@pytest.mark.parametrize(
    ("fault", "parameter", "cause"),
    [
        (
            {"exception": "vllm.exceptions:NoSuchError"},
            "faults[0].exception",
            "'vllm.exceptions:NoSuchError' is not an exception class",
        ),
        (
            {"exception": "os:system"},
            "faults[0].exception",
            "'os:system' is not an exception class",
        ),
        (
            {
                "exception": "vllm_omni.errors:OmniStageTimeoutError",
                "args": ["slow"],
                "kwargs": {"stage": 1},
            },
            "faults[0].kwargs",
            "cannot be built from args/kwargs (TypeError:",
        ),
        (
            {"exception": "vllm.exceptions:GenerationError", "args": [1, 2, 3, 4]},
            "faults[0].args",
            "cannot be built from args/kwargs (TypeError:",
        ),
    ],
)
def test_fault_exception_that_cannot_be_built_is_rejected_at_load(
    fault: dict[str, Any], parameter: str, cause: str
) -> None:
    with pytest.raises(VLLMValidationError) as info:
        pipeline_from_mapping(_raising(**fault))
    assert info.value.parameter == parameter
    assert cause in str(info.value)


def test_fault_exceptions_are_not_built_by_the_cli_check(tmp_path: Path) -> None:
    """``check_pipeline(build_faults=False)`` must not need vLLM's classes."""
    path = write_pipeline(tmp_path, _raising(exception="vllm.exceptions:NoSuch"))
    assert check_pipeline(path, build_faults=False).faults[0].exception == (
        "vllm.exceptions:NoSuch"
    )
    with pytest.raises(PipelineConfigError) as info:
        check_pipeline(path)
    assert info.value.parameter == "faults[0].exception"


def _imports(module: Any) -> set[str]:
    """Every module a source file imports, at any depth (lazy ones too)."""
    tree = ast.parse(Path(module.__file__).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_config_depends_on_no_engine_module() -> None:
    """Layers point down: the engine's fault injection reads the config; the
    config (which checks each fault's exception at load) imports nothing of
    the engine, the stages or the entry points, not even lazily."""
    above = ("vllm_omni.engine", "vllm_omni.stages", "vllm_omni.entrypoints")
    assert [m for m in _imports(vllm_omni.config) if m.startswith(above)] == []
    assert "vllm_omni.config" in _imports(vllm_omni.engine.faults)
