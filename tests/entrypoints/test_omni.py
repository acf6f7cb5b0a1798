"""The offline ``Omni`` API: results in, semantic exceptions out (§4)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import (
    OmniClientError,
    VLLMClientError,
    VLLMValidationError,
)

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


def test_guardrail_violation_is_a_client_error(omni: Omni) -> None:
    with pytest.raises(VLLMClientError) as info:
        omni.generate("let us discuss the forbidden-topic")
    assert isinstance(info.value, OmniClientError)
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
        assert len(pids) == 6
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
