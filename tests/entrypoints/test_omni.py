"""The offline ``Omni`` API: results in, semantic exceptions out (§4)."""

from __future__ import annotations

import os
import pickle
import re
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import (
    GuardrailViolationError,
    OmniClientError,
    OmniErrorDetails,
    OmniServiceUnavailableError,
    VLLMClientError,
    VLLMValidationError,
    normalize,
)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def omni() -> Iterator[Omni]:
    with Omni(pipeline="reference") as omni:
        yield omni


def test_generate_one_and_many(omni: Omni) -> None:
    out = omni.generate("hello offline", params={"max_tokens": 3})
    assert out.finished and out.text == "You said: hello"
    outs = omni.generate(["a", "b"], modalities=["text"])
    assert [o.text for o in outs] == ["You said: a", "You said: b"]


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"top_p": 0.5}, "top_p"),  # a vllm stage's, not the reference's
        ({"max_token": 3}, "max_token"),  # a typo
        ({"voice": "nova"}, "voice"),  # the talker is not on a text route
    ],
)
def test_a_key_no_stage_reads_is_refused_not_dropped(
    omni: Omni, params: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(VLLMValidationError) as info:
        omni.generate("hello", params=params)
    details = info.value.details
    assert details is not None
    assert (details.status_code, details.parameter) == (400, parameter)
    assert "thinker" in details.message


def test_keys_the_stages_read_are_honoured(omni: Omni) -> None:
    out = omni.generate("hello there", params={"stop": ["there"], "n": 2})
    assert [c.text for c in out.choices] == ["You said: hello ", "You said: hello "]
    assert [c.finish_reason for c in out.choices] == ["stop", "stop"]
    spoken = omni.generate("hi", modalities=["text", "audio"], params={"voice": "nova"})
    assert spoken.audio


def test_guardrail_violation_is_a_client_error(omni: Omni) -> None:
    with pytest.raises(GuardrailViolationError) as info:
        omni.generate("let us discuss the forbidden-topic")
    assert isinstance(info.value, OmniClientError)
    assert isinstance(info.value, VLLMClientError)
    details = info.value.details
    assert details is not None
    assert details.error_type == "GuardrailViolationError"
    assert (details.status_code, details.category, details.stage_id) == (
        400,
        "client",
        0,
    )


def test_in_process_validation_raises_the_semantic_exception(omni: Omni) -> None:
    with pytest.raises(VLLMValidationError):
        omni.generate("x", modalities=["smell"])


def test_errors_as_records(omni: Omni) -> None:
    good, bad = omni.generate(
        ["fine", "bad"],
        modalities="image",
        params={"size": "64x64"},
        raise_on_error=False,
    )
    assert good.details is None and good.image
    bad_params = omni.generate(
        ["x"], modalities="image", params={"size": "1x1"}, raise_on_error=False
    )[0]
    assert bad_params.failed and bad_params.details is not None
    assert bad_params.details.parameter == "size"
    assert (
        bad_params.diffusion is not None
        and bad_params.diffusion.details == bad_params.details
    )
    assert bad.details is None


def test_context_manager_stops_every_stage() -> None:
    with Omni(pipeline="reference") as omni:
        pids = [pid for pid in omni.engine.stage_pids().values() if pid is not None]
        # Every stage but the guardrail, which runs in this process.
        assert len(pids) == 5 and omni.engine.stage_pids()[0] is None
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    ("prompts", "parameter"),
    [
        (None, "prompts"),
        (7, "prompts"),
        ({"a": 1}, "prompts"),
        (b"bytes", "prompts"),
        (["fine", 7], "prompts.1"),
        (["fine", None], "prompts.1"),
    ],
)
def test_prompts_are_validated_at_the_boundary(
    omni: Omni, prompts: Any, parameter: str
) -> None:
    with pytest.raises(VLLMValidationError) as info:
        omni.generate(prompts)
    assert info.value.parameter == parameter
    assert info.value.details == OmniErrorDetails(  # type: ignore[attr-defined]
        info.value.args[0], "client", 400, "BadRequestError", parameter=parameter
    )
    clone = pickle.loads(pickle.dumps(info.value))
    assert clone.details == info.value.details  # type: ignore[attr-defined]


def test_modalities_are_validated_with_details(omni: Omni) -> None:
    with pytest.raises(VLLMValidationError) as info:
        omni.generate("x", modalities=7)  # type: ignore[arg-type]
    assert info.value.details.parameter == "modalities"  # type: ignore[attr-defined]


def test_calls_after_close_are_503(recwarn: pytest.WarningsRecorder) -> None:
    omni = Omni(pipeline="reference")
    omni.close()
    for _ in range(2):
        with pytest.raises(OmniServiceUnavailableError) as info:
            omni.generate("hello")
        assert info.value.details == OmniErrorDetails(  # type: ignore[attr-defined]
            "The engine is closed.", "server", 503, "ServiceUnavailableError"
        )
    omni.close()  # idempotent
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def _doc_blocks() -> tuple[str, str]:
    text = (ROOT / "docs" / "errors" / "python.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S)
    output = re.search(r"It prints:\n\n```text\n(.*?)```", text, re.S)
    assert example and output
    return example.group(1), output.group(1)


def test_the_python_doc_example_runs_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example runs as a script would (``__name__ == "__main__"``), in
    this process so that it reuses the stage launcher (no second vLLM
    import), and prints exactly what the doc says it prints."""
    code, expected = _doc_blocks()
    script = tmp_path / "example.py"
    script.write_text(code)
    capsys.readouterr()
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out == expected


def test_a_bad_pipeline_is_a_validation_error_with_details(tmp_path: Path) -> None:
    with pytest.raises(VLLMValidationError) as info:
        Omni(pipeline=tmp_path / "nope.yaml")
    details = info.value.details  # type: ignore[attr-defined]
    assert isinstance(details, OmniErrorDetails)
    assert (details.category, details.status_code) == ("client", 400)
    assert normalize(info.value) == details
