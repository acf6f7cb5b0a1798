"""Cancellation owns its outcome (§9): a ``CancelledError`` that stage code
raises on its own is a 500 record for that request (not silence, not a 504),
every abort is counted by reason, and an engine dropped without
``shutdown()`` stops its stages."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

import pytest

from tests.engine.engines import collect, stage_active, wait_for, write_pipeline
from tests.prom import local
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import OmniEngineGenerateError, OmniStageTimeoutError

pytestmark = pytest.mark.timeout(60)

ALL_STAGES = (0, 1, 2, 3)
GENERIC = "The server had an error while processing your request."


async def test_stage_raising_cancelled_error_is_a_500_record(
    drill_engine: AsyncOmni,
) -> None:
    started = time.monotonic()
    with pytest.raises(OmniEngineGenerateError) as info:
        await collect(drill_engine, "stop @cancel", request_id="self-cancel-1")
    # Stage 1's deadline is 1 s: a record, not the deadline, ended it.
    assert time.monotonic() - started < 1.0
    details = info.value.details
    assert details is not None
    assert (details.status_code, details.category, details.error_type) == (
        500,
        "server",
        "InternalServerError",
    )
    assert (details.stage_id, details.request_id, details.message) == (
        1,
        "self-cancel-1",
        GENERIC,
    )
    assert not details.fatal and not drill_engine.errored
    stats = await drill_engine.stage_stats()
    assert stats[1] is not None and "self-cancel-1" not in stats[1]["active"]
    # The stage goes on serving.
    outputs = await collect(drill_engine, "next one", request_id="self-cancel-2")
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"


async def test_aborts_are_counted_by_reason(drill_engine: AsyncOmni) -> None:
    before = {
        reason: local("vllm_omni:aborts_total", reason=reason)
        for reason in ("cancelled", "timeout", "abort", "client_disconnect")
    }
    # A consumer that goes away: "cancelled".
    task = asyncio.create_task(
        collect(drill_engine, "x @hang", request_id="count-cancel")
    )
    await wait_for(lambda: stage_active(drill_engine, 1, "count-cancel"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # A deadline: "timeout".
    with pytest.raises(OmniStageTimeoutError):
        await collect(drill_engine, "x @hang", request_id="count-timeout")
    # An explicit abort: "abort".
    stream = drill_engine.generate("x @hang", request_id="count-abort")
    waiter = asyncio.create_task(anext(stream))
    await wait_for(lambda: stage_active(drill_engine, 1, "count-abort"))
    await drill_engine.abort("count-abort")
    final = await waiter
    assert final.finish_reason == "abort"
    await stream.aclose()

    after = {
        reason: local("vllm_omni:aborts_total", reason=reason) for reason in before
    }
    assert {reason: after[reason] - before[reason] for reason in before} == {
        "cancelled": 1,
        "timeout": 1,
        "abort": 1,
        "client_disconnect": 0,
    }

    async def aborted_everywhere() -> bool:
        stats = await drill_engine.stage_stats()
        return all(
            rid in stats[s]["aborts"]
            for s in ALL_STAGES
            for rid in ("count-cancel", "count-timeout", "count-abort")
        )

    await wait_for(aborted_everywhere)
    assert local("vllm_omni:requests_in_flight") == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie until its parent (the forkserver) reaps it: count it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_dropped_engine_stops_its_stages(pipeline_dir: Path) -> None:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(
            pipeline_dir,
            {"model": "m", "stages": [{"id": 0, "name": "t", "kind": "text"}]},
        )
    )
    pids = [pid for pid in engine.stage_pids().values() if pid is not None]
    assert len(pids) == 1 and _alive(pids[0])
    del engine
    gc.collect()
    deadline = time.monotonic() + 2.0
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "stages outlived the dropped engine"
        await asyncio.sleep(0.05)
