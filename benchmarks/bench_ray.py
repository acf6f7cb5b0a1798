"""Benchmark the Ray worker backend against local stage processes.

Both measurements run in one fresh Python process (Ray is told before its
import that this host is not a cluster, so everything stays on 127.0.0.1):

- ``request latency, ray / multi_process``: the reference pipeline started
  on both backends side by side; the median latency of the same sequence of
  requests (three text, one text + audio, repeated) on each, interleaved so
  both see the same machine load, after a few warm-up requests. The ratio
  is the Ray backend's per-request overhead
  (messages ride the same ZMQ wire, over ``tcp://`` instead of ``ipc://``).
- ``node loss to last in-flight failure``: a ``ray.cluster_utils.Cluster``
  (head + two nodes, Ray health checks every 300 ms) with the talker pinned
  to one node; requests wait in the talker and in the thinker, the talker's
  node is removed without grace, and the time until the last of them has
  failed with ``OmniEngineDeadError`` is compared with the 2 s goal.

``python benchmarks/bench_ray.py`` prints a table; ``run()`` returns the rows
for ``python -m benchmarks``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

DETECTION_GOAL_S = 2.0
_REQUESTS = 40
_WARMUP = 4
_SETTLE_S = 5.0
_IN_FLIGHT = 4
_FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 300,
    "health_check_failure_threshold": 2,
}


async def _latencies(engine: Any, index: int) -> float:
    modalities = ["text", "audio"] if index % 4 == 3 else ["text"]
    start = time.perf_counter()
    async for _ in engine.generate(
        f"benchmark request {index}", request_id=f"b{index}", modalities=modalities
    ):
        pass
    return time.perf_counter() - start


async def _overhead(quick: bool) -> dict[str, float]:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    engines = {
        "ray": AsyncOmni("reference", worker_backend="ray"),
        "multi_process": AsyncOmni("reference"),
    }
    await asyncio.gather(*(engine.start() for engine in engines.values()))
    try:
        # Let Ray's freshly started idle workers finish booting, and warm
        # both wires, before measuring.
        await asyncio.sleep(1.0 if quick else _SETTLE_S)
        for index in range(1 if quick else _WARMUP):
            for engine in engines.values():
                await _latencies(engine, -1 - index)
        samples: dict[str, list[float]] = {name: [] for name in engines}
        for index in range(4 if quick else _REQUESTS):
            for name, engine in engines.items():
                samples[name].append(await _latencies(engine, index))
        return {name: statistics.median(values) for name, values in samples.items()}
    finally:
        for engine in engines.values():
            engine.shutdown()


async def _node_loss() -> float:
    import ray
    from ray.cluster_utils import Cluster

    from vllm_omni.config import pipeline_from_mapping
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "_system_config": _FAST_FAILURE_DETECTION,
        },
    )
    cluster.add_node(num_cpus=1, resources={"node_a": 10})
    node_b = cluster.add_node(num_cpus=1, resources={"node_b": 10})
    cluster.wait_for_nodes()
    pipeline = pipeline_from_mapping(
        {
            "model": "bench-ray",
            "worker_backend": "ray",
            "stages": [
                {"id": 0, "kind": "text", "ray": {"resources": {"node_a": 1}}},
                {"id": 1, "kind": "talker", "ray": {"resources": {"node_b": 1}}},
                {"id": 2, "kind": "vocoder", "ray": {"resources": {"node_a": 1}}},
            ],
            "faults": [
                {"stage": 0, "marker": "@hang", "action": "hang"},
                {"stage": 1, "marker": "@hang", "action": "hang"},
            ],
        }
    )
    engine = AsyncOmni(pipeline)
    try:
        await engine.start()
        failed_at: list[float] = []

        async def doomed(index: int) -> None:
            modalities = ["audio"] if index % 2 else ["text"]
            try:
                async for _ in engine.generate(
                    "wait @hang", request_id=f"n{index}", modalities=modalities
                ):
                    pass
            except Exception:
                failed_at.append(time.perf_counter())

        tasks = [asyncio.create_task(doomed(i)) for i in range(_IN_FLIGHT)]
        await asyncio.sleep(1.0)
        removed = time.perf_counter()
        await asyncio.to_thread(cluster.remove_node, node_b, False)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        assert len(failed_at) == _IN_FLIGHT and engine.errored
        return max(failed_at) - removed
    finally:
        engine.shutdown()
        ray.shutdown()
        cluster.shutdown()


def _probe_main(quick: bool = False) -> None:
    """Runs in the fresh process (``run`` starts it)."""
    overhead = asyncio.run(_overhead(quick))
    detection = asyncio.run(_node_loss())
    print(json.dumps({**overhead, "detection": detection}))


def run(quick: bool = False) -> list[dict[str, object]]:
    """The rows (``quick``: four requests a backend, a short settle)."""
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from benchmarks.bench_ray import _probe_main as m; m({quick})",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    return [
        {
            "benchmark": "request latency, ray / multi_process",
            "ours": round(probe["ray"] * 1000, 2),
            "baseline": round(probe["multi_process"] * 1000, 2),
            "ratio": round(probe["ray"] / probe["multi_process"], 3),
            "unit": "ms",
        },
        {
            "benchmark": "node loss to last in-flight failure (goal 2 s)",
            "ours": round(probe["detection"], 3),
            "baseline": DETECTION_GOAL_S,
            "ratio": round(probe["detection"] / DETECTION_GOAL_S, 3),
            "unit": "s",
            "target": f"<= {DETECTION_GOAL_S}",
            "met": probe["detection"] <= DETECTION_GOAL_S,
        },
    ]


def main() -> int:
    rows = run()
    print(f"{'benchmark':<48} {'ours':>9} {'baseline':>9} {'ratio':>6} unit")
    for row in rows:
        print(
            f"{row['benchmark']:<48} {row['ours']:>9} {row['baseline']:>9} "
            f"{row['ratio']:>6} {row['unit']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
