"""Fatal failures: a stage that dies kills the engine, fast and loudly (§6)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.engines import collect, stage_active, wait_for, write_pipeline
from vllm_omni.config import load_pipeline
from vllm_omni.engine import processes
from vllm_omni.engine.stage_handle import StageStartupError
from vllm_omni.engine.stage_worker import WorkerSpec
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    EngineDeadError,
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
)

pytestmark = pytest.mark.timeout(60)

FATAL = {
    "model": "omni-fatal",
    "stages": [
        {"id": 0, "name": "thinker", "kind": "text", "timeout_s": 30},
        {"id": 1, "name": "talker", "kind": "talker", "timeout_s": 30},
        {"id": 2, "name": "vocoder", "kind": "vocoder"},
    ],
    "faults": [
        {"stage": 0, "marker": "@hang-text", "action": "hang"},
        {"stage": 1, "marker": "@hang-talker", "action": "hang"},
        {"stage": 0, "marker": "@exit", "action": "exit"},
    ],
}


@pytest.fixture
async def engine(pipeline_dir: Path) -> AsyncIterator[AsyncOmni]:
    engine = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, FATAL))
    yield engine
    engine.shutdown()


async def test_sigkill_fails_every_inflight_request_within_2s(
    engine: AsyncOmni, record_property: Any
) -> None:
    requests = {
        "kill-talker-1": ("a @hang-talker", ["audio"]),
        "kill-talker-2": ("b @hang-talker", ["text", "audio"]),
        "kill-text-1": ("c @hang-text", ["text"]),
    }
    tasks = {
        rid: asyncio.create_task(collect(engine, p, request_id=rid, modalities=mods))
        for rid, (p, mods) in requests.items()
    }
    for rid in ("kill-talker-1", "kill-talker-2"):
        await wait_for(lambda rid=rid: stage_active(engine, 1, rid))
    await wait_for(lambda: stage_active(engine, 0, "kill-text-1"))

    talker_pid = engine.stage_pids()[1]
    assert talker_pid is not None
    killed_at = time.monotonic()
    os.kill(talker_pid, signal.SIGKILL)
    async with asyncio.timeout(2.0):
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    latency = time.monotonic() - killed_at
    record_property("sigkill_detection_s", round(latency, 3))
    print(f"SIGKILL detection latency: {latency:.3f} s")

    for rid, result in zip(tasks, results, strict=True):
        assert isinstance(result, OmniEngineDeadError), (rid, result)
        assert isinstance(result, EngineDeadError)
        assert result.stage_id == 1
        assert result.details is not None and result.details.fatal
        assert result.details.request_id == rid
    assert engine.errored and not engine.is_running
    assert not engine.should_keep_api_server_alive
    with pytest.raises(OmniEngineDeadError) as info:
        await engine.check_health()
    assert info.value.stage_id == 1
    # Dead before the request: refused before anything is sent.
    with pytest.raises(OmniEngineDeadError):
        await collect(engine, "hello", request_id="after-death")
    stats = await engine.stage_stats()
    assert stats[1] is None and stats[0] is not None
    assert "after-death" not in stats[0]["aborts"] + stats[0]["active"]


async def test_exit_fault_is_fatal(engine: AsyncOmni) -> None:
    bystander = asyncio.create_task(
        collect(engine, "z @hang-talker", request_id="bystander", modalities=["audio"])
    )
    await wait_for(lambda: stage_active(engine, 1, "bystander"))
    async with asyncio.timeout(2.0):
        with pytest.raises(OmniEngineDeadError) as info:
            await collect(engine, "bye @exit", request_id="exit-1")
        with pytest.raises(OmniEngineDeadError) as other:
            await bystander
    assert info.value.stage_id == 0 and other.value.stage_id == 0
    assert "exited with code 1" in str(info.value)
    assert engine.errored and engine.dead_error.stage_id == 0  # type: ignore[attr-defined]


async def test_a_stage_exits_when_its_orchestrator_is_gone(tmp_path: Path) -> None:
    """A worker polls the orchestrator's pid (and its parent) and exits when gone."""
    stand_in = subprocess.Popen(["sleep", "60"])
    pipeline = load_pipeline("reference")
    spec = WorkerSpec(
        stage=pipeline.stages[0],
        pipeline=pipeline,
        address=f"ipc://{tmp_path}/nobody.sock",
        orchestrator_pid=stand_in.pid,
    )
    lease = processes.acquire()
    process = await asyncio.to_thread(lease.start_stage, spec, "orphan")
    try:
        await asyncio.sleep(0.3)
        assert process.is_alive()
        stand_in.kill()
        stand_in.wait()
        await asyncio.to_thread(process.join, 3.0)
        assert not process.is_alive()
    finally:
        stand_in.kill()
        if process.is_alive():
            process.kill()
        lease.release()


@contextlib.asynccontextmanager
async def _remote_stage(
    pipeline_dir: Path,
    *,
    orchestrator_timeout_s: float,
    heartbeat_timeout_s: float = 1.5,
    silence_timeout_s: float | None = None,
) -> AsyncIterator[tuple[AsyncOmni, processes.StageProcess]]:
    """An engine over ``tcp://`` (heartbeat timeout 1.5 s: no silence, only
    death) whose one stage runs as a remote process, started; both stopped
    afterwards."""
    document = {
        "model": "omni-remote",
        "stages": [{"id": 0, "name": "thinker", "kind": "text", "remote": True}],
        "faults": [{"stage": 0, "marker": "@hang", "action": "hang"}],
    }
    path = write_pipeline(pipeline_dir, document)
    engine = AsyncOmni(
        pipeline=path,
        transport="tcp",
        heartbeat_timeout_s=heartbeat_timeout_s,
        silence_timeout_s=silence_timeout_s,
    )
    starting = asyncio.create_task(engine.start())
    await wait_for(_true_when(lambda: bool(engine.address)))
    assert engine.address.startswith("tcp://127.0.0.1:")
    pipeline = load_pipeline(path)
    spec = WorkerSpec(
        stage=pipeline.stages[0],
        pipeline=pipeline,
        address=engine.address,
        orchestrator_timeout_s=orchestrator_timeout_s,
    )
    lease = processes.acquire()
    remote = await asyncio.to_thread(lease.start_stage, spec, "remote")
    try:
        await starting
        yield engine, remote
    finally:
        engine.shutdown()
        if remote.is_alive():
            os.kill(remote.pid, signal.SIGCONT)  # stopped by a drill
            remote.kill()
        lease.release()


async def test_remote_stage_over_tcp_and_heartbeat_loss(pipeline_dir: Path) -> None:
    async with _remote_stage(pipeline_dir, orchestrator_timeout_s=5.0) as (
        engine,
        remote,
    ):
        outputs = await collect(engine, "over tcp", request_id="tcp-1")
        assert outputs[-1].text == "You said: over tcp"
        remote.kill()
        start = time.monotonic()
        await wait_for(_true_when(lambda: engine.errored), timeout_s=3.0)
        assert time.monotonic() - start < 2.5
        assert engine.dead_error.stage_id == 0  # type: ignore[attr-defined]


async def test_a_machine_wide_pause_is_not_a_stage_death(
    pipeline_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole machine pauses (a busy VM host, a suspended laptop) for
    longer than both timeouts: the remote stage is stopped, and so is the
    orchestrator's loop (this test's). Neither end may count that time as
    the other's silence (``vllm_omni.engine.liveness``): before, the
    orchestrator woke first and marked the healthy stage dead. A stage that
    then really stays silent is still dead after the timeout."""
    async with _remote_stage(pipeline_dir, orchestrator_timeout_s=2.0) as (
        engine,
        remote,
    ):
        assert (await collect(engine, "before", request_id="p-1"))[-1].text == (
            "You said: before"
        )
        os.kill(remote.pid, signal.SIGSTOP)
        time.sleep(3.5)  # this loop, the orchestrator's, is paused too
        os.kill(remote.pid, signal.SIGCONT)
        await asyncio.sleep(1.0)
        assert not engine.errored
        assert remote.is_alive()
        assert (await collect(engine, "after", request_id="p-2"))[-1].text == (
            "You said: after"
        )
        assert "the orchestrator did not run for 3." in caplog.text
        # Silence while the orchestrator runs is still a death.
        os.kill(remote.pid, signal.SIGSTOP)
        start = time.monotonic()
        await wait_for(_true_when(lambda: engine.errored), timeout_s=4.0)
        assert 1.4 < time.monotonic() - start < 3.5
        assert engine.dead_error.reason == "stage heartbeat lost"  # type: ignore[attr-defined]


async def test_a_silent_remote_stage_is_504_then_503_until_heard_again(
    pipeline_dir: Path,
) -> None:
    """The remote stage's process alone is stopped (a host cut off by the
    network is drilled in ``tests/e2e/test_partitions.py``; this needs no
    network namespaces). Not heard from for ``silence_timeout_s``: the
    request it holds fails with 504, a new one is refused with 503, both
    naming it; resumed before ``heartbeat_timeout_s``, it serves again and
    drops the request that timed out; the engine never died."""
    async with _remote_stage(
        pipeline_dir,
        orchestrator_timeout_s=10.0,
        heartbeat_timeout_s=5.0,
        silence_timeout_s=1.5,
    ) as (engine, remote):
        held = asyncio.create_task(collect(engine, "x @hang", request_id="s-1"))
        await wait_for(lambda: stage_active(engine, 0, "s-1"))
        os.kill(remote.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            with pytest.raises(OmniStageTimeoutError) as timed_out:
                await asyncio.wait_for(held, timeout=4.0)
            silent_after = time.monotonic() - stopped
            with pytest.raises(OmniServiceUnavailableError) as refused:
                await collect(engine, "more", request_id="s-2")
        finally:
            os.kill(remote.pid, signal.SIGCONT)
        assert 0.5 < silent_after < 3.0
        for error, status, error_type, message in (
            (timed_out.value, 504, "GatewayTimeoutError", "stopped answering."),
            (
                refused.value,
                503,
                "ServiceUnavailableError",
                "is not answering; retry later.",
            ),
        ):
            assert error.details is not None
            assert (
                error.details.status_code,
                error.details.error_type,
                error.details.stage_id,
                error.details.message,
            ) == (status, error_type, 0, f"Stage 0 (thinker) {message}")
        await wait_for(_served(engine), timeout_s=5.0)
        stats = (await engine.stage_stats())[0]
        assert stats is not None and "s-1" in stats["cancelled"]
        assert not engine.errored


def _served(engine: AsyncOmni) -> Any:
    count = iter(range(1000))

    async def check() -> bool:
        try:
            await collect(engine, "back", request_id=f"back-{next(count)}")
        except OmniServiceUnavailableError:
            await asyncio.sleep(0.1)
            return False
        return True

    return check


def _true_when(condition: Any) -> Any:
    async def check() -> bool:
        return bool(condition())

    return check


async def test_a_stage_that_cannot_start_fails_the_start(pipeline_dir: Path) -> None:
    document = {
        "model": "omni-broken",
        "stages": [
            {"id": 0, "name": "thinker", "kind": "text"},
            {"id": 7, "name": "gpu", "kind": "vllm", "options": {"engine_args": {}}},
        ],
    }
    engine = AsyncOmni(pipeline=write_pipeline(pipeline_dir, document))
    with pytest.raises(StageStartupError) as info:
        await engine.start()
    # A startup error naming the stage and its cause, not engine death.
    assert info.value.stage_id == 7 and info.value.details is not None
    assert info.value.details.stage_id == 7
    assert info.value.details.status_code == 503
    assert not info.value.details.fatal
    assert str(info.value).startswith(
        "Stage 7 (gpu) failed to start: VLLMValidationError: "
        "a vllm stage needs options.engine_args with a model"
    )
    assert not engine.errored and not engine.is_running
    assert all(pid is None or not _alive(pid) for pid in engine.stage_pids().values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
