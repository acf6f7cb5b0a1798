"""Benchmark the startup of the reference pipeline's stage processes.

Stage processes are forks of one forkserver that preloads the stage worker
module, so vLLM (and torch) is imported once for all stages instead of once
per stage. Each measurement runs in a fresh Python process (no forkserver
yet) and is compared with the baseline of that same machine: a bare
``python -c "import vllm"``.

Rows:

- ``reference pipeline startup``: ``await AsyncOmni.create("reference")``
  in a process that has imported ``vllm_omni`` (the forkserver is cold: the
  time includes its vLLM import and the six stage forks);
- ``reference pipeline startup (warm forkserver)``: a second engine in the
  same process (six forks, six ready handshakes);
- ``process start to ready``: from interpreter start (imports included) to
  a ready engine, what ``vllm-omni serve`` pays before it can listen.

``python benchmarks/bench_startup.py`` prints a table; ``run()`` returns the
rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

REPEATS_ENV = "VLLM_OMNI_BENCH_REPEATS"

_ENGINE_PROBE = """
import asyncio, json, time
start = time.perf_counter()
from vllm_omni.entrypoints.async_omni import AsyncOmni

async def main():
    t = time.perf_counter()
    engine = await AsyncOmni.create(pipeline="reference")
    ready = time.perf_counter()
    cold = ready - t
    engine.shutdown()
    t = time.perf_counter()
    engine = await AsyncOmni.create(pipeline="reference")
    warm = time.perf_counter() - t
    engine.shutdown()
    print(json.dumps({"cold": cold, "warm": warm, "to_ready": ready - start}))

asyncio.run(main())
"""


def run(repeats: int | None = None) -> list[dict[str, object]]:
    """Median of ``repeats`` fresh-process runs (``$VLLM_OMNI_BENCH_REPEATS``,
    default 1: each run imports vLLM several times)."""
    repeats = repeats or int(os.environ.get(REPEATS_ENV, "1"))
    baseline = statistics.median(_import_vllm_seconds() for _ in range(repeats))
    probes = [_probe() for _ in range(repeats)]
    return [
        _row("reference pipeline startup", [p["cold"] for p in probes], baseline),
        _row(
            "reference pipeline startup (warm forkserver)",
            [p["warm"] for p in probes],
            baseline,
        ),
        _row("process start to ready", [p["to_ready"] for p in probes], baseline),
    ]


def _row(name: str, samples: list[float], baseline: float) -> dict[str, object]:
    ours = statistics.median(samples)
    return {
        "benchmark": name,
        "ours": round(ours, 3),
        "baseline": round(baseline, 3),
        "ratio": round(ours / baseline, 3),
        "unit": "s",
    }


def _import_vllm_seconds() -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import vllm"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def _probe() -> dict[str, float]:
    # Run with -c: there is no main script for the stage processes to re-run.
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_PROBE],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    rows = run()
    print(f"{'benchmark':<46} {'ours s':>8} {'import vllm s':>14} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['benchmark']:<46} {row['ours']:>8.2f} {row['baseline']:>14.2f} "
            f"{row['ratio']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
