"""Benchmark startup: stage processes, and ``vllm-omni serve`` to ``/health``.

Stage processes are forks of one launcher process that imports the stage
worker module, so vLLM (and torch) is imported once for all stages instead of
once per stage, and the server starts the launcher before its own vLLM import
so the two overlap. Each measurement runs in a fresh Python process and is
compared with the baseline of that same machine, measured in the same run: a
bare ``python -c "import vllm"``.

Rows:

- ``reference pipeline startup``: ``await AsyncOmni.create("reference")``
  in a process that has imported ``vllm_omni`` (the launcher was started
  with that import: the time is what is left of its vLLM import plus the six
  stage forks);
- ``reference pipeline startup (warm launcher)``: a second engine in the
  same process (six forks, six ready handshakes);
- ``process start to ready``: from interpreter start (imports included) to
  a ready engine;
- ``serve: process start to /health 200``: ``vllm-omni serve`` on the
  reference pipeline, from ``exec`` to the first 200 of ``GET /health``;
  target: at most 1.6x the bare import (``target``, ``met``);
- ``floor: import the server's modules``: ``python -c "import
  vllm_omni.entrypoints.openai.api_server"``, the least the row above can
  take (``import vllm`` plus FastAPI; ``vllm.config``, which upstream's
  engine-exception package and launcher module would load, is left out by
  ``vllm_omni.upstream``).

``python benchmarks/bench_startup.py`` prints a table; ``run()`` returns the
rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from tests.ports import free_port

REPEATS_ENV = "VLLM_OMNI_BENCH_REPEATS"
# Issue 10: process start to /health 200 within 1.6x a bare `import vllm`.
HEALTH_TARGET_RATIO = 1.6
_HEALTH_TIMEOUT_S = 300.0
_SERVER_MODULE = "vllm_omni.entrypoints.openai.api_server"

_ENGINE_PROBE = """
import asyncio, json, time
start = time.perf_counter()
from vllm_omni.engine import processes
processes.hold()  # one launcher for both engines, started before our import
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


def run(repeats: int | None = None, quick: bool = False) -> list[dict[str, object]]:
    """Median of ``repeats`` fresh-process runs (``$VLLM_OMNI_BENCH_REPEATS``,
    default 1: each run imports vLLM several times); ``quick``: one run, the
    server compared with the one bare import."""
    repeats = 1 if quick else repeats or int(os.environ.get(REPEATS_ENV, "1"))
    baseline = statistics.median(_import_vllm_seconds() for _ in range(repeats))
    probes = [_probe() for _ in range(repeats)]
    # The machine's load drifts: time the bare import right before and after
    # each server start, and compare the server with their mean.
    health: list[float] = []
    around: list[float] = []
    for _ in range(repeats):
        before = baseline if quick else _import_vllm_seconds()
        health.append(_serve_to_health_seconds())
        around.append(before if quick else (before + _import_vllm_seconds()) / 2)
    serve_row = _row(
        "serve: process start to /health 200", health, statistics.median(around)
    )
    # The floor of that row: importing what the server needs: ``vllm``
    # itself, not ``vllm.config`` (vllm_omni.upstream loads upstream's engine
    # exceptions without their package and defers upstream's launcher).
    floor = _row(
        "floor: import the server's modules",
        [_import_seconds(_SERVER_MODULE) for _ in range(repeats)],
        baseline,
    )
    serve_row["target"] = f"<= {HEALTH_TARGET_RATIO}"
    serve_row["met"] = serve_row["ratio"] <= HEALTH_TARGET_RATIO  # type: ignore[operator]
    return [
        _row("reference pipeline startup", [p["cold"] for p in probes], baseline),
        _row(
            "reference pipeline startup (warm launcher)",
            [p["warm"] for p in probes],
            baseline,
        ),
        _row("process start to ready", [p["to_ready"] for p in probes], baseline),
        serve_row,
        floor,
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
    return _import_seconds("vllm")


def _import_seconds(module: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def _serve_to_health_seconds() -> float:
    """``vllm-omni serve`` from exec to the first ``GET /health`` 200."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="omni-bench-") as directory:
        argv = [
            sys.executable,
            "-m",
            "vllm_omni.entrypoints.cli.main",
            "serve",
            "--port",
            str(port),
            "--job-store",
            os.path.join(directory, "jobs.sqlite3"),
            "--log-level",
            "warning",
        ]
        start = time.perf_counter()
        server = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            while time.perf_counter() - start < _HEALTH_TIMEOUT_S:
                if server.poll() is not None:
                    raise RuntimeError(f"server exited with code {server.returncode}")
                try:
                    url = f"http://127.0.0.1:{port}/health"
                    if httpx.get(url, timeout=1.0).status_code == 200:
                        return time.perf_counter() - start
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            raise RuntimeError("server not healthy in time")
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _probe() -> dict[str, float]:
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
