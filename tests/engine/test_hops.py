"""Hop marks (``vllm_omni.wire.hops``): off by default, and when on, one
mark per step of a request's critical path in every process it crosses, in
causal order, as ``benchmarks/bench_real_engine.py --breakdown`` reads them
(``benchmarks.breakdown``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.breakdown import critical_path
from tests.engine.engines import collect
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.wire import hops

pytestmark = pytest.mark.timeout(120)

_TRACED = """
import asyncio, json, sys
from vllm_omni.wire import hops
from vllm_omni.entrypoints.async_omni import AsyncOmni

async def main():
    engine = await AsyncOmni.create(pipeline="reference")
    try:
        hops.mark("traced-1", "caller.generate")
        async for output in engine.generate("hello", request_id="traced-1"):
            if output.text_delta:
                hops.mark("traced-1", "caller.first")
        hops.mark("traced-2", "caller.generate")
        try:
            async for _ in engine.generate("forbidden-topic", request_id="traced-2"):
                pass
        except Exception:
            hops.mark("traced-2", "caller.raised")
        marks = hops.take()
        stages = await engine._orchestrator.call_utility("hops")
        for stage_marks in stages.values():
            marks += stage_marks
        print(json.dumps({"enabled": hops.enabled(), "marks": marks}))
    finally:
        engine.shutdown()

asyncio.run(main())
"""


def _steps(path: list[tuple[str, int]]) -> list[str]:
    return [step for step, _ in path]


def test_marks_follow_the_critical_path_across_processes() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TRACED],
        env={**os.environ, hops.ENV: "1"},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["enabled"] is True
    marks = [tuple(mark) for mark in result["marks"]]
    route = [(0, "guardrail"), (1, "thinker")]
    first = critical_path(
        [m for m in marks if m[0] == "traced-1"],
        route,
        start="caller.generate",
        end="caller.first",
    )
    assert _steps(first) == [
        "caller.generate",
        "orchestrator.generate",
        # The guardrail runs in the orchestrator's process: no hop.
        "orchestrator.submit [guardrail]",
        "stage.started [guardrail]",
        "stage.payload [guardrail]",
        "stage.finished [guardrail]",
        "orchestrator.submit [thinker]",
        "stage.received [thinker]",
        "stage.started [thinker]",
        "stage.payload [thinker]",
        "orchestrator.received [thinker]",
        "orchestrator.yield [thinker]",
        "caller.first",
    ]
    times = [ns for _, ns in first]
    assert times == sorted(times)
    refused = critical_path(
        [m for m in marks if m[0] == "traced-2"],
        route[:1],
        start="caller.generate",
        end="caller.raised",
        failing=True,
    )
    assert _steps(refused) == [
        "caller.generate",
        "orchestrator.generate",
        "orchestrator.submit [guardrail]",
        "stage.started [guardrail]",
        "stage.failing [guardrail]",
        "stage.failed [guardrail]",
        "caller.raised",
    ]


async def test_nothing_is_recorded_unless_asked(drill_engine: AsyncOmni) -> None:
    assert os.environ.get(hops.ENV) != "1" and not hops.enabled()
    await collect(drill_engine, "hello", request_id="untraced-1")
    assert hops.take() == []
    stages = await drill_engine._orchestrator.call_utility("hops")
    assert stages and all(marks == [] for marks in stages.values())
