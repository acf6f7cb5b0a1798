"""The offline API as vllm-omni callers write it, on the reference pipeline.

``generate(prompts, sampling_params_list, use_tqdm=..., py_generator=...)``
has vllm-omni 0.30's shapes (always a list, or an iterator), today's keyword
calls keep theirs; the progress bar is vLLM's ("Processed prompts", on
stderr); a caller's own mistakes are the caller's errors (the ``TypeError``
itself, or ``VLLMValidationError`` naming the argument), never the generic
server text. The ``vllm`` stage side (``Omni(model=...)``) runs in
``tests/real_engine/test_omni_model.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import OmniServerError, VLLMValidationError
from vllm_omni.outputs import OmniRequestOutput

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def omni() -> Iterator[Omni]:
    with Omni() as omni:
        yield omni


def test_a_list_gives_a_list_in_prompt_order(omni: Omni) -> None:
    outputs = omni.generate(
        ["one two three", "four five six"], [None, {"max_tokens": 3}]
    )
    assert [o.text for o in outputs] == ["You said: one", "You said: four"]
    assert all(o.finished and o.finish_reason == "length" for o in outputs)


def test_one_prompt_the_030_way_is_a_list_of_one(omni: Omni) -> None:
    outputs = omni.generate("one two three", [None, {"max_tokens": 2}])
    assert isinstance(outputs, list)
    assert [o.text for o in outputs] == ["You said:"]
    # Today's call keeps today's shape.
    assert isinstance(omni.generate("one two"), OmniRequestOutput)


def test_py_generator_yields_each_final_output(omni: Omni) -> None:
    outputs = omni.generate(
        ["a b", "c d e", "f"], [None, {"max_tokens": 3}], py_generator=True
    )
    assert not isinstance(outputs, list)
    texts = sorted(o.text for o in outputs if o.finished)
    assert texts == ["You said: a", "You said: c", "You said: f"]


def test_failed_prompts_are_outputs_when_asked(omni: Omni) -> None:
    outputs = omni.generate(
        ["fine", "forbidden-topic"], [None, {"max_tokens": 2}], raise_on_error=False
    )
    assert [o.finish_reason for o in outputs] == ["length", "error"]
    assert outputs[1].details is not None
    assert outputs[1].details.error_type == "GuardrailViolationError"


@pytest.mark.parametrize(
    ("use_tqdm", "shown"), [(True, True), (False, False)], ids=["on", "off"]
)
def test_the_progress_bar(
    omni: Omni, capsys: pytest.CaptureFixture[str], use_tqdm: bool, shown: bool
) -> None:
    omni.generate(["a", "b"], [None, {"max_tokens": 3}], use_tqdm=use_tqdm)
    captured = capsys.readouterr()
    assert ("Processed prompts: 100%" in captured.err) is shown, captured.err
    assert "2/2" in captured.err if shown else captured.err == ""
    assert captured.out == ""


def test_the_progress_bar_is_on_by_default(
    omni: Omni, capsys: pytest.CaptureFixture[str]
) -> None:
    omni.generate("a b")
    assert "Processed prompts: 100%" in capsys.readouterr().err


# (call, the parameter the VLLMValidationError names)
WRONG_CALLS: dict[str, tuple[Any, str]] = {
    "a key the thinker does not read": (
        lambda o: o.generate(["x"], [None, {"top_k": 1}]),
        "sampling_params_list.1.top_k",
    ),
    "a value outside its domain": (
        lambda o: o.generate(["x"], [None, {"temperature": 9.0}]),
        "sampling_params_list.1.temperature",
    ),
    "not a list": (
        lambda o: o.generate(["x"], {"max_tokens": 1}),
        "sampling_params_list",
    ),
    "use_tqdm": (lambda o: o.generate(["x"], use_tqdm="yes"), "use_tqdm"),
    "prompts": (lambda o: o.generate([1]), "prompts.0"),
}


@pytest.mark.parametrize("case", sorted(WRONG_CALLS))
def test_a_wrong_value_is_named(omni: Omni, case: str) -> None:
    call, parameter = WRONG_CALLS[case]
    with pytest.raises(VLLMValidationError) as info:
        call(omni)
    assert info.value.parameter == parameter
    assert not isinstance(info.value, OmniServerError)


def test_an_unknown_keyword_is_the_type_error_itself(omni: Omni) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        omni.generate(["x"], bogus=1)  # type: ignore[call-overload]


# Constructor arguments → the parameter named; none starts an engine.
WRONG_ENGINES: dict[str, tuple[dict[str, Any], str]] = {
    "a model path that does not exist": ({"model": "/no/such/model"}, "model"),
    "an engine argument without a vllm stage": (
        {"max_model_len": 128},
        "max_model_len",
    ),
    "not an engine argument": (
        {"model": "facebook/opt-125m", "max_model_lenn": 128},
        "max_model_lenn",
    ),
    "a model that is not a string": ({"model": 5}, "model"),
}


@pytest.mark.parametrize("case", sorted(WRONG_ENGINES))
@pytest.mark.parametrize("api", [Omni, AsyncOmni], ids=["Omni", "AsyncOmni"])
def test_a_wrong_engine_argument_is_named(api: type, case: str) -> None:
    kwargs, parameter = WRONG_ENGINES[case]
    with pytest.raises(VLLMValidationError) as info:
        api(**kwargs)
    assert info.value.parameter == parameter
    assert "server had an error" not in str(info.value)


def test_a_wrong_positional_call_is_the_type_error_itself() -> None:
    with pytest.raises(TypeError, match="positional"):
        Omni("reference", "extra")  # type: ignore[call-arg]


# -- AsyncOmni.generate, called as 0.30 (and vLLM's AsyncLLM) calls it ---------------


async def _texts(stream: Any) -> list[str]:
    return [output.text async for output in stream if output.finished]


async def test_async_generate_takes_0_30_positional_arguments(
    reference_engine: AsyncOmni,
) -> None:
    """``generate(prompt, sampling_params, request_id, output_modalities=...)``
    beside today's keywords: the same request, the same answer."""
    today = await _texts(
        reference_engine.generate(
            "one two three",
            request_id="r-today",
            modalities=["text"],
            params={"max_tokens": 2},
        )
    )
    positional = await _texts(
        reference_engine.generate(
            "one two three", {"max_tokens": 2}, "r-030", output_modalities=["text"]
        )
    )
    assert positional == today == ["You said:"]
    # The request id given positionally is the request's (a second one in
    # flight under it would be a 409; a finished one is reusable).
    async for output in reference_engine.generate("four", None, "r-030"):
        assert output.request_id == "r-030"


# One argument under both of its names → the 0.30 name.
BOTH_NAMES: dict[str, tuple[tuple[Any, ...], dict[str, Any], str]] = {
    "sampling_params and params": (
        ({"max_tokens": 2},),
        {"params": {"max_tokens": 3}},
        "sampling_params",
    ),
    "output_modalities and modalities": (
        (),
        {"modalities": ["text"], "output_modalities": ["text"]},
        "output_modalities",
    ),
    "a request id that is empty": ((None, ""), {}, "request_id"),
}


@pytest.mark.parametrize("case", sorted(BOTH_NAMES))
async def test_async_generate_names_a_wrong_0_30_call(
    reference_engine: AsyncOmni, case: str
) -> None:
    args, kwargs, parameter = BOTH_NAMES[case]
    with pytest.raises(VLLMValidationError) as info:
        await _texts(reference_engine.generate("x", *args, **kwargs))
    assert info.value.parameter == parameter


async def test_async_generate_refuses_0_30_keywords_it_has_not(
    reference_engine: AsyncOmni,
) -> None:
    """0.30's other keywords (``lora_request``, ``priority``, ...) are the
    ``TypeError`` itself: nothing is dropped."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'priority'"):
        await _texts(reference_engine.generate("x", priority=1))  # type: ignore[call-arg]
