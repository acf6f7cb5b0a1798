"""Pipeline YAML: the built-in reference loads; a bad file names its bad key."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest

import vllm_omni.config
import vllm_omni.engine.faults
from tests.engine.engines import write_pipeline
from vllm_omni.config import (
    PipelineConfigError,
    check_model_pipeline,
    check_pipeline,
    load_pipeline,
    pipeline_for_model,
    pipeline_from_mapping,
    with_traces_endpoint,
)
from vllm_omni.entrypoints.async_omni import AsyncOmni
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


@pytest.mark.parametrize(
    ("engine_args", "refused"),
    [
        ({"enable_fault_tolerance": True}, "enable_fault_tolerance"),
        ({"fault_tolerance_config": {}}, "fault_tolerance_config"),
        (
            {"fault_tolerance_config": {}, "data_parallel_size": 2},
            "fault_tolerance_config",
        ),
        # Where vLLM runs it (external-LB data parallelism), the server honours it.
        ({"enable_fault_tolerance": True, "data_parallel_external_lb": True}, None),
        ({"enable_fault_tolerance": True, "data_parallel_rank": 0}, None),
        ({"enable_fault_tolerance": False}, None),
        ({"fault_tolerance_config": None}, None),
        ({}, None),
    ],
)
def test_fault_tolerance_without_external_lb_is_refused_at_load(
    engine_args: dict[str, Any], refused: str | None
) -> None:
    stage = {
        "id": 0,
        "kind": "vllm",
        "options": {"engine_args": {"model": "m", **engine_args}},
    }
    document = {"model": "m", "stages": [stage]}
    if refused is None:
        pipeline_from_mapping(document)
        return
    with pytest.raises(VLLMValidationError) as info:
        pipeline_from_mapping(document)
    assert info.value.parameter == f"stages[0].options.engine_args.{refused}"
    assert "\n" not in str(info.value)
    assert "fault tolerance is not supported" in str(info.value)
    assert "external-load-balancer data parallelism" in str(info.value)


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
    modules = [
        vllm_omni.config,
        *(
            importlib.import_module(f"vllm_omni.config.{info.name}")
            for info in pkgutil.iter_modules(vllm_omni.config.__path__)
        ),
    ]
    assert len(modules) > 5
    imported = set().union(*(_imports(module) for module in modules))
    assert [m for m in imported if m.startswith(above)] == []
    assert "vllm_omni.config" in _imports(vllm_omni.engine.faults)


def test_stages_on_other_hosts_keys_are_read() -> None:
    """``orchestrator_address`` binds tcp for remote stages (``vllm-omni
    serve`` reads it from the file); the liveness timeouts default to 10 s
    and none (the engine's default applies, 3 s)."""
    pipeline = pipeline_from_mapping(
        {
            **GOOD,
            "orchestrator_address": "tcp://10.0.0.1:5555",
            "heartbeat_timeout_s": 8,
            "silence_timeout_s": 2.5,
        }
    )
    assert pipeline.orchestrator_address == ("10.0.0.1", 5555)
    assert (pipeline.heartbeat_timeout_s, pipeline.silence_timeout_s) == (8.0, 2.5)
    plain = pipeline_from_mapping(GOOD)
    assert plain.orchestrator_address is None
    assert (plain.heartbeat_timeout_s, plain.silence_timeout_s) == (10.0, None)


@pytest.mark.parametrize(
    ("extra", "parameter"),
    [
        ({"orchestrator_address": "10.0.0.1:5555"}, "orchestrator_address"),
        ({"orchestrator_address": "tcp://10.0.0.1"}, "orchestrator_address"),
        ({"orchestrator_address": "tcp://:5555"}, "orchestrator_address"),
        ({"orchestrator_address": "tcp://h:70000"}, "orchestrator_address"),
        ({"orchestrator_address": 5555}, "orchestrator_address"),
        ({"heartbeat_timeout_s": 0}, "heartbeat_timeout_s"),
        ({"heartbeat_timeout_s": "10"}, "heartbeat_timeout_s"),
        ({"silence_timeout_s": 1}, "silence_timeout_s"),  # the heartbeat interval
        ({"silence_timeout_s": 10}, "silence_timeout_s"),  # the heartbeat timeout
        ({"silence_timeout_s": True}, "silence_timeout_s"),
        ({"heartbeat_timeout_s": 2, "silence_timeout_s": 3}, "silence_timeout_s"),
    ],
)
def test_bad_liveness_keys_name_their_key(
    extra: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(VLLMValidationError) as caught:
        pipeline_from_mapping({**GOOD, **extra})
    assert caught.value.parameter == parameter


def _orchestrator_settings(engine: AsyncOmni) -> tuple[Any, ...]:
    orchestrator = engine._orchestrator
    return (
        orchestrator.channel.transport,
        orchestrator.channel.host,
        orchestrator.channel.port,
        orchestrator.supervisor.watch.heartbeat_timeout_s,
        orchestrator.supervisor.watch.silence_timeout_s,
    )


def test_engine_arguments_override_the_file_and_the_default_silence_follows() -> None:
    remote = pipeline_from_mapping(
        {**GOOD, "orchestrator_address": "tcp://0.0.0.0:5555", "heartbeat_timeout_s": 8}
    )
    assert _orchestrator_settings(AsyncOmni(remote)) == ("tcp", "0.0.0.0", 5555, 8, 3)
    assert _orchestrator_settings(
        AsyncOmni(remote, host="127.0.0.1", port=0, silence_timeout_s=2)
    ) == ("tcp", "127.0.0.1", 0, 8, 2)
    plain = pipeline_from_mapping(GOOD)
    assert _orchestrator_settings(AsyncOmni(plain)) == ("ipc", "127.0.0.1", 0, 10, 3)
    # A heartbeat timeout of 3 s or less leaves no room for a silence: the
    # stage is dead first, as before.
    assert _orchestrator_settings(AsyncOmni(plain, heartbeat_timeout_s=1.5))[3:] == (
        1.5,
        None,
    )
    with pytest.raises(VLLMValidationError) as caught:
        AsyncOmni(plain, heartbeat_timeout_s=4, silence_timeout_s=5)
    assert caught.value.parameter == "silence_timeout_s"


def test_a_model_without_a_pipeline_is_one_vllm_stage_in_process() -> None:
    pipeline = pipeline_for_model("org/tiny", {"max_model_len": 128})
    (stage,) = pipeline.stages
    assert (stage.id, stage.kind, stage.in_process) == (0, "vllm", True)
    assert stage.options["engine_args"] == {"model": "org/tiny", "max_model_len": 128}
    assert pipeline.model == "org/tiny"
    named = pipeline_for_model("org/tiny", served_model_name="tiny")
    assert named.model == "tiny"


def test_a_pipeline_file_gives_model_and_engine_args_to_its_vllm_stage() -> None:
    base = pipeline_from_mapping(
        {
            "model": "served",
            "stages": [
                {"id": 0, "kind": "guardrail"},
                {
                    "id": 1,
                    "kind": "vllm",
                    "options": {
                        "engine_args": {"model": "old", "dtype": "float32"},
                        "lora_modules": {},
                    },
                },
            ],
        }
    )
    pipeline = pipeline_for_model("new", {"max_model_len": 64}, base=base)
    assert pipeline.model == "served"
    assert pipeline.stages[0] == base.stages[0]
    assert pipeline.stages[1].options == {
        "engine_args": {"model": "new", "dtype": "float32", "max_model_len": 64},
        "lora_modules": {},
    }
    assert base.stages[1].options["engine_args"]["model"] == "old"
    assert pipeline_for_model(None, base=base) is base


@pytest.mark.parametrize(
    ("model", "engine_args", "parameter"),
    [
        ("m", {}, "model"),
        (None, {"max_model_len": 64}, "max_model_len"),
    ],
)
def test_engine_arguments_a_pipeline_cannot_take_are_refused_by_name(
    model: str | None, engine_args: dict[str, Any], parameter: str
) -> None:
    reference = load_pipeline("reference")
    with pytest.raises(PipelineConfigError) as light:
        check_model_pipeline(model, engine_args, base=reference)
    assert light.value.parameter == parameter
    assert "no vllm stage" in str(light.value)
    with pytest.raises(VLLMValidationError) as public:
        pipeline_for_model(model, engine_args, base=reference)
    assert public.value.parameter == parameter


def test_a_model_is_needed_without_a_pipeline() -> None:
    for model in (None, ""):
        with pytest.raises(VLLMValidationError) as caught:
            pipeline_for_model(model)
        assert caught.value.parameter == "model"


def test_a_traces_endpoint_reaches_every_process_and_every_vllm_engine() -> None:
    base = pipeline_from_mapping(
        {
            "model": "m",
            "stages": [
                {"id": 0, "name": "guardrail", "kind": "guardrail"},
                {
                    "id": 1,
                    "name": "a",
                    "kind": "vllm",
                    "options": {"engine_args": {"model": "x"}},
                },
                {
                    "id": 2,
                    "name": "b",
                    "kind": "vllm",
                    "options": {
                        "engine_args": {"model": "y", "otlp_traces_endpoint": "own"}
                    },
                },
            ],
        }
    )
    assert with_traces_endpoint(base, None) is base
    traced = with_traces_endpoint(base, "http://c:4317")
    assert traced.otlp_traces_endpoint == "http://c:4317"
    guardrail, first, second = traced.stages
    assert guardrail == base.stages[0]
    assert first.options["engine_args"] == {
        "model": "x",
        "otlp_traces_endpoint": "http://c:4317",
    }
    # A stage's own endpoint in its file is kept.
    assert second.options["engine_args"]["otlp_traces_endpoint"] == "own"
