"""The Ray backend in process: stages as actors on a real local Ray.

One Ray instance (127.0.0.1) and one Ray engine per module. The tests that
start engines of their own come first: the offline one blocks this thread,
and with it the loop of the module's engines, for half a minute or more on a
loaded host, and a Ray stage gives up on an orchestrator silent for twice
its heartbeat timeout. The same pipeline
also runs on ``multi_process`` so a stage's record can be compared field by
field across backends. Drills: a stage raising client and server errors, a
stage actor's worker stopped (SIGSTOP) and the instance's GCS stopped at
request time, an actor killed with ``ray.kill`` (last: it kills the engine),
placement that cannot be satisfied, and the promise that the default backend
never imports Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import psutil
import pytest
import pytest_asyncio
import ray
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.engines import collect, stage_active, wait_for
from tests.prom import local_text
from tests.ray.drills import FAST_FAILURE_DETECTION, drill_pipeline, ping, stopped
from vllm_omni.config import pipeline_from_mapping
from vllm_omni.engine.stage_handle import StageStartupError
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import (
    EngineDeadError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    RemoteOmniServiceUnavailableError,
    RemoteVLLMNotFoundError,
    RemoteVLLMValidationError,
)
from vllm_omni.errors.details import OmniErrorDetails

# The first test on the module's engines also pays for starting them (a
# local Ray instance and two engines): the budget covers that on a loaded
# machine, as the default does.
pytestmark = pytest.mark.timeout(300)

PIPELINE = pipeline_from_mapping(drill_pipeline())


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=FAST_FAILURE_DETECTION,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest_asyncio.fixture(scope="module")
async def engines(local_ray: None) -> AsyncIterator[dict[str, AsyncOmni]]:
    """The drill pipeline on both backends, started side by side."""
    pair = {
        "ray": AsyncOmni(PIPELINE),
        "multi_process": AsyncOmni(PIPELINE, worker_backend="multi_process"),
    }
    try:
        await asyncio.gather(*(engine.start() for engine in pair.values()))
        yield pair
    finally:
        for engine in pair.values():
            engine.shutdown()


async def test_placement_that_cannot_happen_is_a_startup_error(
    local_ray: None,
) -> None:
    pipeline = pipeline_from_mapping(
        {
            "model": "omni-unplaceable",
            "worker_backend": "ray",
            "stage_init_timeout_s": 1.5,
            "stages": [
                {"id": 0, "name": "thinker", "kind": "text"},
                {
                    "id": 7,
                    "name": "gpu-talker",
                    "kind": "talker",
                    "ray": {"num_cpus": 1, "resources": {"big_gpu_node": 1}},
                },
            ],
        }
    )
    engine = AsyncOmni(pipeline)
    started = time.monotonic()
    with pytest.raises(StageStartupError) as caught:
        await engine.start()
    assert time.monotonic() - started < 30
    error = caught.value
    assert error.stage_id == 7
    assert str(error) == (
        "Stage 7 (gpu-talker) failed to start: not placed on the Ray cluster "
        "within 1.5 s (missing: big_gpu_node=1)"
    )
    assert error.details is not None and error.details.stage_id == 7
    assert error.details.status_code == 503
    assert not engine.is_running
    namespace = engine._orchestrator.supervisor.launcher.namespace  # type: ignore[union-attr]
    named = ray.util.list_named_actors(all_namespaces=True)
    assert [a for a in named if a["namespace"] == namespace] == []


def test_offline_omni_runs_on_ray_until_a_stage_stays_silent(
    local_ray: None,
) -> None:
    """``Omni`` takes the same backend arguments (on its own loop thread).
    Then its one stage's worker is stopped for good: the request it holds
    gets 504, the next one 503, and past the heartbeat timeout the engine is
    dead with that stage's id (last: it kills this engine).

    The held request is at the stage before the stop (its hang fault keeps
    it there): its outcome does not depend on a race between its submission
    and the probe. (It once did: the drill sent a plain request just after
    the stop and needed it to reach the stage before the probe noticed, and
    under load it failed with ``DID NOT RAISE OmniStageTimeoutError``.)"""
    pipeline = pipeline_from_mapping(
        {
            "model": "omni-offline",
            "stages": [{"id": 0, "name": "thinker", "kind": "text"}],
            "faults": [
                {"stage": 0, "marker": "@boom", "action": "raise"},
                {"stage": 0, "marker": "@hang", "action": "hang"},
            ],
        }
    )
    with Omni(
        pipeline,
        worker_backend="ray",
        heartbeat_timeout_s=4,
        ray_probe_interval_s=0.25,
        ray_probe_timeout_s=1,
    ) as omni:
        assert omni.engine.worker_backend == "ray"
        assert omni.generate("offline hello").text == "You said: offline hello"
        with pytest.raises(OmniEngineGenerateError) as caught:
            omni.generate("x @boom")
        assert caught.value.details is not None
        assert (caught.value.details.status_code, caught.value.details.stage_id) == (
            500,
            0,
        )
        held: list[BaseException] = []
        holder = threading.Thread(target=_generate_into, args=(omni, held))
        holder.start()
        deadline = time.monotonic() + 10
        while not omni._call(omni.engine.stage_stats())[0]["active"]:  # type: ignore[index]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with stopped(ping(_actor(omni.engine, 0))):
            holder.join(timeout=15)
            [timed_out] = held
            # Silent since before that 504 was raised: refused at once.
            with pytest.raises(OmniServiceUnavailableError) as refused:
                omni.generate("refused")
            deadline = time.monotonic() + 10
            while not omni.engine.errored:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            with pytest.raises(OmniEngineDeadError) as dead:
                omni.generate("after")
    assert isinstance(timed_out, OmniStageTimeoutError), timed_out
    assert [
        (e.details.status_code, e.details.stage_id, e.details.fatal)  # type: ignore[attr-defined]
        for e in (timed_out, refused.value, dead.value)
    ] == [(504, 0, False), (503, 0, False), (500, 0, True)]
    assert dead.value.reason == "stage heartbeat lost"


def _generate_into(omni: Omni, sink: list[BaseException]) -> None:
    try:
        omni.generate("in flight @hang")
    except BaseException as exc:  # the drill checks which
        sink.append(exc)


def _actor(engine: AsyncOmni, stage_id: int) -> ray.actor.ActorHandle:
    namespace = engine._orchestrator.supervisor.launcher.namespace  # type: ignore[union-attr]
    return ray.get_actor(f"omni-stage-{stage_id}", namespace=namespace)


async def test_each_stage_is_a_ray_actor(engines: dict[str, AsyncOmni]) -> None:
    engine = engines["ray"]
    assert engine.worker_backend == "ray" and engine.address.startswith(
        "tcp://127.0.0.1:"
    )
    # The stage that answered Ready runs inside its actor's process (Ray
    # titles it after the actor class and the method it runs).
    titles = {
        stage_id: " ".join(psutil.Process(pid).cmdline())
        for stage_id, pid in engine.stage_pids().items()
        if pid is not None
    }
    assert sorted(titles) == [0, 1, 2]
    assert all(t.startswith("ray::_StageActor") for t in titles.values()), titles
    named = ray.util.list_named_actors(all_namespaces=True)
    namespace = engine._orchestrator.supervisor.launcher.namespace  # type: ignore[union-attr]
    assert sorted(a["name"] for a in named if a["namespace"] == namespace) == [
        "omni-stage-0",
        "omni-stage-1",
        "omni-stage-2",
    ]
    outputs = await collect(
        engine, "hello ray", request_id="ray-ok", modalities=["text", "audio"]
    )
    assert outputs[-1].text == "You said: hello ray"
    assert outputs[-1].audio and outputs[-1].audio[:4] == b"RIFF"


async def test_stage_actors_export_no_engine_metrics_for_reference_stages(
    engines: dict[str, AsyncOmni],
) -> None:
    """Each actor answers the scrape's call with its registry's vllm:
    families: none, the reference stages are not vLLM (a vllm stage's are
    checked on the real engine, tests/real_engine/test_ray.py)."""
    engine = engines["ray"]
    for stage_id in (0, 1, 2):
        call = _actor(engine, stage_id).metrics.options(concurrency_group="metrics")
        assert await asyncio.to_thread(ray.get, call.remote(), timeout=10) == []
    text = await asyncio.to_thread(local_text)
    families = {family.name for family in text_string_to_metric_families(text)}
    assert "vllm_omni:engine_dead" in families
    assert not {name for name in families if name.startswith("vllm:")}


async def _failure(engine: AsyncOmni, prompt: str, modalities: list[str]) -> Exception:
    with pytest.raises(Exception) as caught:
        await collect(engine, prompt, request_id="same-id", modalities=modalities)
    return caught.value


@pytest.mark.parametrize(
    ("prompt", "modalities", "cls", "status", "error_type", "stage_id"),
    [
        ("x @invalid", ["text"], RemoteVLLMValidationError, 400, "BadRequestError", 0),
        ("x @novoice", ["audio"], RemoteVLLMNotFoundError, 404, "NotFoundError", 1),
        ("x @boom", ["text"], OmniEngineGenerateError, 500, "InternalServerError", 0),
        ("x @secret", ["text"], OmniEngineGenerateError, 500, "InternalServerError", 0),
        (
            "x @unavailable",
            ["audio"],
            RemoteOmniServiceUnavailableError,
            503,
            "ServiceUnavailableError",
            1,
        ),
    ],
)
async def test_stage_record_is_the_same_on_both_backends(
    engines: dict[str, AsyncOmni],
    prompt: str,
    modalities: list[str],
    cls: type[Exception],
    status: int,
    error_type: str,
    stage_id: int,
) -> None:
    got = {
        name: await _failure(engine, prompt, modalities)
        for name, engine in engines.items()
    }
    ray_error, local_error = got["ray"], got["multi_process"]
    assert type(ray_error) is cls and type(local_error) is cls
    record: OmniErrorDetails = ray_error.details  # type: ignore[attr-defined]
    assert (record.status_code, record.error_type, record.stage_id) == (
        status,
        error_type,
        stage_id,
    )
    assert record == local_error.details  # type: ignore[attr-defined]
    assert "hf_SECRET" not in record.message and "/home/alice" not in record.message
    assert engines["ray"].is_running and not engines["ray"].errored


async def _refused(engine: AsyncOmni, request_id: str, modalities: list[str]) -> bool:
    try:
        await collect(engine, "anyone?", request_id=request_id, modalities=modalities)
    except OmniServiceUnavailableError:
        return True
    return False


async def test_a_silent_stage_times_out_its_requests_and_refuses_new_ones(
    engines: dict[str, AsyncOmni],
) -> None:
    engine = engines["ray"]
    talker = await asyncio.to_thread(ping, _actor(engine, 1))
    assert talker == engine.stage_pids()[1] != os.getpid()
    at_talker = asyncio.create_task(
        collect(engine, "hi @talkhang", request_id="s1", modalities=["audio"])
    )
    await wait_for(lambda: stage_active(engine, 1, "s1"))
    with stopped(talker):
        with pytest.raises(OmniStageTimeoutError) as timed_out:
            await asyncio.wait_for(at_talker, timeout=8)
        with pytest.raises(OmniServiceUnavailableError) as refused:
            await collect(engine, "more", request_id="s2", modalities=["audio"])
        # A request that does not need the silent stage is served.
        text = await collect(engine, "just text", request_id="s3")
        assert text[-1].text == "You said: just text"
        # A scrape waits for the silent actor's metrics a bounded time only.
        started = time.monotonic()
        await asyncio.to_thread(local_text)
        assert time.monotonic() - started < 4.0
    for error, status, error_type in (
        (timed_out.value, 504, "GatewayTimeoutError"),
        (refused.value, 503, "ServiceUnavailableError"),
    ):
        assert error.details is not None
        assert (
            error.details.status_code,
            error.details.error_type,
            error.details.stage_id,
            error.details.fatal,
        ) == (status, error_type, 1, False)
    assert timed_out.value.details.message == "Stage 1 (talker) stopped answering."
    assert refused.value.details.message == (
        "Stage 1 (talker) is not answering; retry later."
    )
    # Aborted in every stage: the talker drops it once it runs again.
    await wait_for(lambda: _not_active(engine, 1, "s1"), timeout_s=10)
    await wait_for(lambda: _served(engine, "s4", ["audio"]), timeout_s=10)
    assert engine.is_running and not engine.errored


async def _not_active(engine: AsyncOmni, stage_id: int, request_id: str) -> bool:
    return not await stage_active(engine, stage_id, request_id)


async def _served(engine: AsyncOmni, request_id: str, modalities: list[str]) -> bool:
    try:
        outputs = await collect(
            engine, "back", request_id=request_id, modalities=modalities
        )
    except OmniServiceUnavailableError:
        await asyncio.sleep(0.2)
        return False
    return outputs[-1].finished and outputs[-1].finish_reason == "stop"


def _gcs_server() -> psutil.Process:
    """The GCS of this module's Ray instance (a child of this process)."""
    return next(
        p for p in psutil.Process().children(recursive=True) if p.name() == "gcs_server"
    )


async def test_an_unreachable_cluster_refuses_new_requests_only(
    engines: dict[str, AsyncOmni],
) -> None:
    engine = engines["ray"]
    admitted = engine.generate(
        "before the outage", request_id="g1", modalities=["text", "audio"]
    )
    first = await anext(admitted)  # the thinker's first token; talker not asked yet
    assert first.text_delta == "You"
    with stopped(_gcs_server().pid):
        await wait_for(lambda: _refused(engine, "g2", ["text"]), timeout_s=8)
        with pytest.raises(OmniServiceUnavailableError) as refused:
            await collect(engine, "during", request_id="g3", modalities=["audio"])
        # The admitted request goes on to the talker and vocoder over the wire.
        rest = [output async for output in admitted]
    assert rest[-1].text == "You said: before the outage"
    assert rest[-1].audio and rest[-1].audio[:4] == b"RIFF"
    details = refused.value.details
    assert details is not None
    # The stage it would have started at: an audio request starts at the talker.
    assert (details.status_code, details.error_type, details.stage_id) == (
        503,
        "ServiceUnavailableError",
        1,
    )
    assert details.message == "Stage 1 (talker) cannot be reached; retry later."
    await wait_for(lambda: _served(engine, "g4", ["text"]), timeout_s=10)
    assert engine.is_running and not engine.errored


async def test_killed_actor_fails_every_in_flight_request(
    engines: dict[str, AsyncOmni],
) -> None:
    """Last in the module: it kills the Ray engine."""
    engine = engines["ray"]
    at_talker = asyncio.create_task(
        collect(engine, "hi @talkhang", request_id="k1", modalities=["audio"])
    )
    at_thinker = asyncio.create_task(
        collect(engine, "hi @hang", request_id="k2", modalities=["text"])
    )
    await asyncio.sleep(1.0)
    assert not at_talker.done() and not at_thinker.done()
    killed = time.monotonic()
    ray.kill(_actor(engine, 1), no_restart=True)
    results = await asyncio.gather(at_talker, at_thinker, return_exceptions=True)
    detected = time.monotonic() - killed
    for result in results:
        assert type(result) is OmniEngineDeadError
        assert isinstance(result, EngineDeadError)
        assert result.stage_id == 1
        assert result.details is not None
        assert dataclasses.astuple(result.details)[1:4] == (
            "server",
            500,
            "InternalServerError",
        )
        assert result.details.fatal and result.details.stage_id == 1
        assert result.details.message == EngineDeadError.CLIENT_MESSAGE
    assert detected < 10
    assert engine.errored and not engine.is_running
    assert "ActorDiedError" in str(engine.dead_error)
    with pytest.raises(OmniEngineDeadError) as refused:
        await collect(engine, "after", request_id="k3")
    assert refused.value.stage_id == 1
    # The other backend is untouched.
    assert engines["multi_process"].is_running


def test_default_backend_never_imports_ray() -> None:
    code = (
        "import sys, vllm_omni\n"
        "from vllm_omni.entrypoints.async_omni import AsyncOmni\n"
        "from vllm_omni.entrypoints.cli.serve import make_parser\n"
        "from vllm_omni.entrypoints.openai import api_server\n"
        "AsyncOmni('reference')\n"
        "assert make_parser().parse_args([]).worker_backend is None\n"
        "print('ray' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
