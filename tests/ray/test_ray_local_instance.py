"""``worker_backend="ray"`` without an address: the engine starts its own
Ray instance on 127.0.0.1 and stops it on shutdown.

Runs in a fresh process whose environment says nothing about Ray (the
tests' conftest tells Ray to stay on loopback; the engine must do that by
itself), also where the caller imported Ray first (vLLM's ``AsyncLLM``
imports it), and inspects that process's children: every socket Ray listens
on is a loopback one, and none of Ray's processes outlives the engine.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.omni_server import Background, start_in_background

pytestmark = pytest.mark.timeout(180)

_PROBE = """
import asyncio, json, sys, psutil
if sys.argv[1] == "ray-first":
    import ray
from vllm_omni.config import pipeline_from_mapping
from vllm_omni.entrypoints.async_omni import AsyncOmni

async def main():
    me = psutil.Process()
    engine = AsyncOmni(pipeline_from_mapping(
        {"model": "m", "worker_backend": "ray", "stages": [{"id": 0, "kind": "text"}]}
    ))
    await engine.start()
    import ray  # after start, as a server would: the engine imports Ray first
    text = [o async for o in engine.generate("hi", request_id="r1")][-1].text
    ray_processes = me.children(recursive=True)
    listening = sorted({
        c.laddr.ip
        for p in ray_processes
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    })
    gcs = ray.get_runtime_context().gcs_address
    engine.shutdown()
    gone, alive = psutil.wait_procs(ray_processes, timeout=20)
    print(json.dumps({
        "address": engine.address, "text": text, "gcs": gcs,
        "listening": listening, "ray_initialized": ray.is_initialized(),
        "ray_processes": len(ray_processes), "left": [p.pid for p in alive],
    }))

asyncio.run(main())
"""


IMPORTED = ("engine-first", "ray-first")


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Background]]:
    """Both probes, started together when the first of their tests starts
    (each starts a Ray instance of its own, on ports of its own); each test
    waits for its own."""
    directory = tmp_path_factory.mktemp("ray-local-probes")
    env = {
        k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    }
    started: dict[str, Background] = {}
    try:
        for imported in IMPORTED:
            started[imported] = start_in_background(
                directory, imported, sys.executable, "-c", _PROBE, imported, env=env
            )
        yield started
    finally:
        for probe in started.values():
            probe.stop()


@pytest.mark.parametrize("imported", IMPORTED)
def test_engine_starts_and_stops_a_loopback_ray(
    imported: str, probes: dict[str, Background]
) -> None:
    code, stdout, stderr = probes[imported].result(timeout=170)
    assert code == 0, stderr[-3000:]
    probe = json.loads(stdout.strip().splitlines()[-1])
    assert probe["text"] == "You said: hi"
    assert probe["address"].startswith("tcp://127.0.0.1:")
    assert probe["gcs"].startswith("127.0.0.1:")
    assert probe["ray_processes"] > 0
    assert set(probe["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, probe
    assert probe["ray_initialized"] is False
    assert probe["left"] == []
