"""Nonfatal failures, deadlines and cancellation affect one request only (§6)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.engine.engines import collect, stage_active, wait_for
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    OmniEngineGenerateError,
    OmniStageTimeoutError,
    VLLMServerError,
)
from vllm_omni.stages.text import TextParams, reference_tokens

pytestmark = pytest.mark.timeout(60)

ALL_STAGES = (0, 1, 2, 3)


def expected_text(prompt: str) -> str:
    return "".join(reference_tokens(prompt, TextParams())[0])


async def test_one_failing_request_of_eight_fails_alone(
    drill_engine: AsyncOmni,
) -> None:
    prompts = [f"request number {i}" for i in range(8)]
    prompts[5] = "request number 5 @raise"

    async def one(i: int) -> str:
        outputs = await collect(drill_engine, prompts[i], request_id=f"nonfatal-{i}")
        assert outputs[-1].finished
        assert [o.text_delta for o in outputs[:-1]] == reference_tokens(
            prompts[i], TextParams()
        )[0]
        return outputs[-1].text

    results = await asyncio.gather(*(one(i) for i in range(8)), return_exceptions=True)
    failed = results.pop(5)
    assert isinstance(failed, OmniEngineGenerateError)
    assert failed.stage_id == 1 and failed.details is not None
    assert failed.details.request_id == "nonfatal-5" and not failed.details.fatal
    assert (
        failed.details.message
        == "The server had an error while processing your request."
    )
    assert results == [expected_text(p) for i, p in enumerate(prompts) if i != 5]
    assert not drill_engine.errored
    await drill_engine.check_health()


async def test_deadline_gives_504_and_frees_the_stage(drill_engine: AsyncOmni) -> None:
    submitted = time.monotonic()
    hung = asyncio.create_task(
        collect(drill_engine, "x @hang", request_id="deadline-1")
    )
    await wait_for(lambda: stage_active(drill_engine, 1, "deadline-1"))
    # While one request hangs in stage 1, the stage serves others.
    outputs = await collect(drill_engine, "still served", request_id="deadline-2")
    assert outputs[-1].text == expected_text("still served")

    with pytest.raises(OmniStageTimeoutError) as info:
        await hung
    assert time.monotonic() - submitted >= 1.0  # not before the deadline
    assert info.value.stage_id == 1 and isinstance(info.value, VLLMServerError)
    assert info.value.status_code == 504

    async def aborted_everywhere() -> bool:
        # Stage 1 cancels its running task on the abort; the task leaves the
        # active set when it has unwound, a loop turn later.
        stats = await drill_engine.stage_stats()
        return all("deadline-1" in stats[s]["aborts"] for s in ALL_STAGES) and (
            "deadline-1" not in stats[1]["active"]
        )

    await wait_for(aborted_everywhere)
    stats = await drill_engine.stage_stats()
    assert "deadline-1" in stats[1]["cancelled"]
    outputs = await collect(drill_engine, "after the deadline", request_id="deadline-3")
    assert outputs[-1].text == expected_text("after the deadline")


async def test_cancelled_generate_aborts_in_every_stage(
    drill_engine: AsyncOmni,
) -> None:
    before = await drill_engine.stage_stats()
    seen: list[str] = []

    async def consume() -> None:
        async for out in drill_engine.generate(
            "speak @talker-hang", request_id="cancel-1", modalities=["text", "audio"]
        ):
            seen.append(out.text_delta)

    task = asyncio.create_task(consume())
    await wait_for(lambda: stage_active(drill_engine, 2, "cancel-1"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen  # text streamed before the talker held the request

    async def aborted_everywhere() -> bool:
        stats = await drill_engine.stage_stats()
        return all("cancel-1" in stats[s]["aborts"] for s in ALL_STAGES)

    await wait_for(aborted_everywhere)
    after = await drill_engine.stage_stats()
    assert "cancel-1" in after[2]["cancelled"]
    # Cancellation is not an error, on either side.
    assert [after[s]["failed"] for s in ALL_STAGES] == [
        before[s]["failed"] for s in ALL_STAGES
    ]
    assert not drill_engine.errored


async def test_closing_the_stream_aborts_in_every_stage(
    drill_engine: AsyncOmni,
) -> None:
    stream = drill_engine.generate(
        "a long reply " * 50, request_id="close-1", params={"max_tokens": 200}
    )
    first = await anext(stream)
    assert first.text_delta == "You"
    await stream.aclose()  # GeneratorExit: what a disconnected HTTP client causes

    async def aborted_everywhere() -> bool:
        stats = await drill_engine.stage_stats()
        return all("close-1" in stats[s]["aborts"] for s in ALL_STAGES)

    await wait_for(aborted_everywhere)


async def test_abort_ends_the_stream_with_finish_reason_abort(
    drill_engine: AsyncOmni,
) -> None:
    task = asyncio.create_task(collect(drill_engine, "x @hang", request_id="abort-1"))
    await wait_for(lambda: stage_active(drill_engine, 1, "abort-1"))
    await drill_engine.abort("abort-1")
    outputs = await task
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"

    async def cancelled() -> bool:
        return "abort-1" in (await drill_engine.stage_stats())[1]["cancelled"]

    await wait_for(cancelled)
