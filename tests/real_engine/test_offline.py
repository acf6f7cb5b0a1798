"""The real engine through the offline ``Omni`` API, LoRA enabled: results
in, the semantic exception with the stage's record out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_engine.conftest import (
    ADAPTER,
    STARTUP_TIMEOUT_S,
    write_tiny_pipeline,
)
from tests.real_engine.tiny_model import MAX_MODEL_LEN
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import OmniClientError, VLLMValidationError

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def omni(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_lora: Path
) -> Iterator[Omni]:
    directory = tmp_path_factory.mktemp("real-offline")
    pipeline = write_tiny_pipeline(directory, tiny_model, lora=tiny_lora)
    with Omni(pipeline=str(pipeline), startup_timeout_s=STARTUP_TIMEOUT_S) as omni:
        yield omni


def test_generate_with_and_without_the_adapter(omni: Omni) -> None:
    # ignore_eos: the random model may pick its EOS early on some CPUs.
    full = {"max_tokens": 8, "ignore_eos": True}
    plain = omni.generate("hello world", params=full)
    assert plain.finished and plain.finish_reason == "length" and plain.text
    tuned = omni.generate("hello world", params={**full, "lora": ADAPTER})
    assert tuned.finished and tuned.finish_reason == "length" and tuned.text


@pytest.mark.parametrize(
    ("prompt", "params", "parameter"),
    [
        ("hello", {"temperature": -1}, "temperature"),
        ("omni stage " * (2 * MAX_MODEL_LEN), {"max_tokens": 4}, "input_text"),
    ],
    ids=["temperature", "too-long"],
)
def test_upstream_validation_is_a_client_error_with_its_parameter(
    omni: Omni, prompt: str, params: dict[str, object], parameter: str
) -> None:
    with pytest.raises(OmniClientError) as info:
        omni.generate(prompt, params=params)
    details = info.value.details
    assert details is not None
    assert (details.status_code, details.parameter, details.stage_id) == (
        400,
        parameter,
        1,
    )
    assert "-1" not in details.message and str(len(prompt)) not in details.message


def test_unknown_adapter_is_not_found_and_the_engine_keeps_serving(
    omni: Omni,
) -> None:
    with pytest.raises(OmniClientError) as info:
        omni.generate("hello", params={"lora": "/no/such/adapter"})
    details = info.value.details
    assert details is not None
    assert (details.status_code, details.error_type, details.stage_id) == (
        404,
        "NotFoundError",
        1,
    )
    assert "/no/such" not in details.message
    after = omni.generate("hello world", params={"max_tokens": 4, "ignore_eos": True})
    assert after.finished and after.text


def test_upstream_sampling_params_are_honoured(omni: Omni) -> None:
    from vllm.sampling_params import SamplingParams

    out = omni.generate(
        "hello world",
        params=SamplingParams(n=2, max_tokens=4, seed=1, ignore_eos=True, logprobs=2),
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.finish_reason for c in out.choices] == ["length", "length"]
    assert all(len(c.logprobs) == 4 for c in out.choices)
    assert out.text == out.choices[0].text


def test_a_key_the_engine_does_not_read_is_refused(omni: Omni) -> None:
    with pytest.raises(VLLMValidationError) as info:
        omni.generate("hello", params={"top_logprobs": 2})
    assert info.value.details is not None
    assert info.value.details.parameter == "top_logprobs"
