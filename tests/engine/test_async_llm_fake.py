"""The stand-ins of ``AsyncLLM`` keep upstream's ``generate`` signature.

A stand-in whose signature drifts from the installed vLLM's would let
``VLLMStage`` pass an argument upstream does not take (or by position where
upstream's is keyword-only) and every test over the stand-in still pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

from vllm.v1.engine.async_llm import AsyncLLM

from tests.engine.async_llm_fake import AsyncLLMFake
from tests.engine.fake_async_llm import FakeAsyncLLM
from tests.engine.fault_tolerant_llm import FaultTolerantLLM


def _parameters(function: Any) -> dict[str, tuple[Any, Any]]:
    return {
        name: (parameter.kind, parameter.default)
        for name, parameter in inspect.signature(function).parameters.items()
    }


def test_generate_takes_what_upstreams_takes_as_upstream_takes_it() -> None:
    upstream = _parameters(AsyncLLM.generate)
    ours = _parameters(AsyncLLMFake.generate)
    assert ours == {name: upstream[name] for name in ours}
    for stand_in in (FakeAsyncLLM, FaultTolerantLLM):
        assert stand_in.generate is AsyncLLMFake.generate


class _Scripted(AsyncLLMFake):
    async def stream(self, prompt: Any, request_id: str) -> AsyncIterator[str]:
        yield "a"
        await asyncio.sleep(3600)
        yield "b"


async def test_each_call_is_recorded_and_a_stream_closed_early_noted() -> None:
    fake = _Scripted()
    stream = fake.generate("p", "params", "r-1", trace_headers={"traceparent": "t"})
    async with contextlib.aclosing(stream) as outputs:
        assert await anext(outputs) == "a"
    assert fake.closed == ["r-1"]
    (call,) = fake.calls
    assert (call.prompt, call.sampling_params) == ("p", "params")
    assert call.request_id == "r-1"
    assert call.trace_headers == {"traceparent": "t"} and call.priority == 0
    assert fake.sampling_params == "params" and fake.lora_requests == [None]
