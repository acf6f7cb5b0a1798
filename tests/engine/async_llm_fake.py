"""What every stand-in of upstream's ``AsyncLLM`` in the tests shares.

``VLLMStage`` drives an ``AsyncLLM``; the tests drive it over stand-ins that
script what the engine does (``fake_async_llm.FakeAsyncLLM``,
``fault_tolerant_llm.FaultTolerantLLM``, ``tests/stages``' scripted one).
Their ``generate`` is this one: upstream's signature for the arguments the
stage passes (``test_async_llm_fake.py`` compares it with the installed
vLLM's), each call recorded, and the stream the caller closes early noted
as ``AsyncLLM`` aborts such a request. A stand-in writes only ``stream``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AsyncLLMFake", "GenerateCall"]


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """One call of ``generate``, as the stage made it."""

    prompt: Any
    sampling_params: Any
    request_id: str
    lora_request: Any
    trace_headers: Mapping[str, str] | None
    priority: int


class AsyncLLMFake:
    """``AsyncLLM.generate``'s signature over a scripted ``stream``."""

    def __init__(self) -> None:
        self.calls: list[GenerateCall] = []
        # The request ids whose stream the caller closed before its end.
        self.closed: list[str] = []
        self.was_shut_down = False

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any,
        request_id: str,
        *,
        lora_request: Any = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
    ) -> AsyncIterator[Any]:
        call = GenerateCall(
            prompt, sampling_params, request_id, lora_request, trace_headers, priority
        )
        self.calls.append(call)
        try:
            async with contextlib.aclosing(self.stream(prompt, request_id)) as outputs:
                async for output in outputs:
                    yield output
        except (GeneratorExit, asyncio.CancelledError):
            self.closed.append(request_id)  # AsyncLLM aborts the request here
            raise

    def stream(self, prompt: Any, request_id: str) -> AsyncIterator[Any]:
        """The engine's outputs for one request (what the stand-in scripts)."""
        raise NotImplementedError

    @property
    def sampling_params(self) -> Any:
        """The last call's sampling parameters (``None`` before any call)."""
        return self.calls[-1].sampling_params if self.calls else None

    @property
    def lora_requests(self) -> list[Any]:
        return [call.lora_request for call in self.calls]

    def shutdown(self) -> None:
        self.was_shut_down = True
