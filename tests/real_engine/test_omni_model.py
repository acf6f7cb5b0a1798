"""vllm-omni's offline calls on the real engine: ``Omni(model=...)`` and
``generate(prompts, sampling_params_list)``.

``Omni(model=<tiny model>, **engine_args)`` serves the model with one
``vllm`` stage (id 0) in this process, as vllm-omni's offline examples
expect; each entry of ``sampling_params_list`` reaches the engine's
``SamplingParams`` (seen by a spy on the stage's ``AsyncLLM.generate``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm.sampling_params import SamplingParams

from tests.real_engine.conftest import STARTUP_TIMEOUT_S
from tests.real_engine.tiny_model import MAX_MODEL_LEN
from vllm_omni.config import MODEL_STAGE_NAME
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import VLLMValidationError

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def omni(tiny_model: Path) -> Iterator[Omni]:
    with Omni(
        model=str(tiny_model),
        max_model_len=MAX_MODEL_LEN,
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=8,
        startup_timeout_s=STARTUP_TIMEOUT_S,
    ) as omni:
        yield omni


def _completion_tokens(output: Any) -> int:
    return int(output.meta[MODEL_STAGE_NAME]["completion_tokens"])


def test_the_030_call_gives_two_finished_outputs_with_a_progress_bar(
    omni: Omni, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = omni.generate(["a", "b"], [SamplingParams(max_tokens=3)])
    assert isinstance(outputs, list) and len(outputs) == 2
    assert all(output.finished for output in outputs)
    assert all(1 <= _completion_tokens(output) <= 3 for output in outputs)
    err = capsys.readouterr().err
    assert "Processed prompts: 100%" in err and "2/2" in err


@pytest.mark.parametrize(
    "entry",
    [
        SamplingParams(max_tokens=3, ignore_eos=True),
        {"max_tokens": 3, "ignore_eos": True},
    ],
    ids=["SamplingParams", "mapping"],
)
def test_the_entry_bounds_the_completion(omni: Omni, entry: Any) -> None:
    (output,) = omni.generate(["hello world"], [entry], use_tqdm=False)
    assert output.finish_reason == "length"
    assert _completion_tokens(output) == 3


def test_temperature_reaches_the_engines_sampling_params(
    omni: Omni, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model's one stage runs in this process (pipeline_for_model).
    stage = omni.engine._orchestrator.supervisor.handles[0].inline._stage  # type: ignore[union-attr]
    engine = stage._engine
    seen: list[SamplingParams] = []
    original = engine.generate

    def spy(
        prompt: Any, sampling_params: SamplingParams, *args: Any, **kwargs: Any
    ) -> Any:
        seen.append(sampling_params)
        return original(prompt, sampling_params, *args, **kwargs)

    monkeypatch.setattr(engine, "generate", spy)
    omni.generate(["a"], [SamplingParams(max_tokens=2, temperature=0.7, seed=5)])
    omni.generate(["a"], [{"max_tokens": 2, "temperature": 0.3, "seed": 5}])
    assert [(s.temperature, s.max_tokens, s.seed) for s in seen] == [
        (0.7, 2, 5),
        (0.3, 2, 5),
    ]


def test_a_wrong_entry_is_named_before_anything_runs(omni: Omni) -> None:
    with pytest.raises(VLLMValidationError) as info:
        omni.generate(["a"], [{"top_k": -5}])
    assert info.value.parameter == "sampling_params_list.0.top_k"
    with pytest.raises(VLLMValidationError) as info:
        omni.generate(["a"], [None, {}])
    assert info.value.parameter == "sampling_params_list"


def test_todays_keyword_call_still_works(omni: Omni) -> None:
    output = omni.generate("hello world", params={"max_tokens": 2, "ignore_eos": True})
    assert output.finished and _completion_tokens(output) == 2


def test_the_async_030_call_reaches_the_engine(omni: Omni) -> None:
    """``AsyncOmni.generate(prompt, sampling_params, request_id)``, as 0.30
    and vLLM's ``AsyncLLM`` are called: upstream's ``SamplingParams`` is the
    request's, the positional id the request's."""

    async def run() -> list[Any]:
        sampling = SamplingParams(max_tokens=2, ignore_eos=True)
        return [
            output
            async for output in omni.engine.generate("hello world", sampling, "r-030")
        ]

    outputs = asyncio.run_coroutine_threadsafe(run(), omni._loop).result(120)
    assert outputs[-1].finished and _completion_tokens(outputs[-1]) == 2
    assert {output.request_id for output in outputs} == {"r-030"}
