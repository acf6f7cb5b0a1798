"""Pipeline YAML: the built-in reference loads; a bad file names its bad key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.engines import write_pipeline
from vllm_omni.config import load_pipeline, pipeline_from_mapping
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
    assert pipeline.faults_for(0)[0].action == "exit"


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


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(VLLMValidationError, match="no built-in pipeline"):
        load_pipeline(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(VLLMValidationError, match="not valid YAML"):
        load_pipeline(bad)
