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
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("imported", ["engine-first", "ray-first"])
def test_engine_starts_and_stops_a_loopback_ray(imported: str) -> None:
    env = {
        k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, imported],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["text"] == "You said: hi"
    assert probe["address"].startswith("tcp://127.0.0.1:")
    assert probe["gcs"].startswith("127.0.0.1:")
    assert probe["ray_processes"] > 0
    assert set(probe["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, probe
    assert probe["ray_initialized"] is False
    assert probe["left"] == []
