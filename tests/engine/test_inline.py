"""Stages that run in the orchestrator's process (``vllm_omni.engine.inline``).

The guardrail runs in the engine's process unless something asks for a
process (a fault drill aimed at it, ``remote``, the Ray backend). Either
way the contract is the same: the same record for the same failure (owner,
status, type, stage id), a ``CancelledError`` the stage raises on its own is
a 500, ``EngineDeadError`` kills the engine, aborts reach it, and
``stage_stats`` answers for it. Each test runs the same request through the
inline guardrail and through a guardrail process, side by side.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from vllm.v1.engine.exceptions import EngineDeadError

from tests.engine.engines import collect, stage_active, wait_for, write_pipeline
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    GuardrailViolationError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
)
from vllm_omni.stages.guardrail import GuardrailStage
from vllm_omni.wire.messages import Payload, Submit

pytestmark = pytest.mark.timeout(120)

MARKER = "@gboom"


def _pipeline(*, process: bool) -> dict[str, Any]:
    faults: list[dict[str, Any]] = [{"stage": 1, "marker": "@hang", "action": "hang"}]
    if process:
        # A drill aimed at the guardrail puts it in a process of its own.
        faults.append({"stage": 0, "marker": MARKER, "action": "raise"})
    return {
        "model": "omni-inline",
        "stages": [
            {"id": 0, "name": "guardrail", "kind": "guardrail", "timeout_s": 5},
            {"id": 1, "name": "thinker", "kind": "text", "timeout_s": 30},
        ],
        "guardrail": {"blocklist": ["forbidden-topic"]},
        "faults": faults,
    }


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(pipeline_dir: Path) -> AsyncIterator[dict[str, AsyncOmni]]:
    started = {
        name: AsyncOmni(write_pipeline(pipeline_dir, _pipeline(process=process)))
        for name, process in (("inline", False), ("process", True))
    }
    await asyncio.gather(*(engine.start() for engine in started.values()))
    yield started
    for engine in started.values():
        engine.shutdown()


@pytest.fixture
def failing_guardrail(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The inline guardrail raises ``raises["exc"]`` for a prompt with MARKER
    (the process guardrail's drill raises ``RuntimeError`` there)."""
    raises: dict[str, Any] = {"exc": RuntimeError("guardrail crashed")}
    original = GuardrailStage.generate

    async def generate(self: GuardrailStage, request: Submit) -> AsyncIterator[Payload]:
        if MARKER in request.prompt:
            raise raises["exc"]
        async for payload in original(self, request):
            yield payload

    monkeypatch.setattr(GuardrailStage, "generate", generate)
    yield raises


async def _failure(engine: AsyncOmni, prompt: str, request_id: str) -> BaseException:
    with pytest.raises(Exception) as info:
        await collect(engine, prompt, request_id=request_id)
    return info.value


async def test_the_guardrail_runs_in_the_engines_process(
    engines: dict[str, AsyncOmni],
) -> None:
    inline, process = engines["inline"], engines["process"]
    assert inline.stage_pids()[0] is None
    assert (await inline.stage_stats())[0]["pid"] == os.getpid()
    assert process.stage_pids()[0] not in (None, os.getpid())
    assert (await process.stage_stats())[0]["pid"] == process.stage_pids()[0]
    for engine in engines.values():
        outputs = await collect(engine, "hello", request_id="inline-hello")
        assert outputs[-1].finished and outputs[-1].text == "You said: hello"


@pytest.mark.usefixtures("failing_guardrail")
@pytest.mark.parametrize(
    ("prompt", "cls", "status"),
    [
        ("about forbidden-topic", GuardrailViolationError, 400),
        (f"x {MARKER}", OmniEngineGenerateError, 500),
    ],
    ids=["guardrail-400", "stage-failure-500"],
)
async def test_the_same_record_from_either_process(
    engines: dict[str, AsyncOmni], prompt: str, cls: type[Exception], status: int
) -> None:
    seen = {
        name: await _failure(engine, prompt, f"same-{status}")
        for name, engine in engines.items()
    }
    inline, process = seen["inline"], seen["process"]
    assert isinstance(inline, cls) and type(inline) is type(process)
    assert inline.details == process.details  # type: ignore[attr-defined]
    assert inline.details.status_code == status  # type: ignore[attr-defined]
    assert inline.details.stage_id == 0  # type: ignore[attr-defined]
    assert inline.details.request_id == f"same-{status}"  # type: ignore[attr-defined]


async def test_a_cancelled_error_the_stage_raises_is_a_500(
    engines: dict[str, AsyncOmni], failing_guardrail: dict[str, Any]
) -> None:
    failing_guardrail["exc"] = asyncio.CancelledError()
    async with asyncio.timeout(5):
        error = await _failure(engines["inline"], f"x {MARKER}", "inline-cancel")
    assert isinstance(error, OmniEngineGenerateError)
    assert error.details.status_code == 500 and error.details.stage_id == 0


async def test_counts_and_aborts_reach_the_inline_stage(
    engines: dict[str, AsyncOmni],
) -> None:
    engine = engines["inline"]
    before = (await engine.stage_stats())[0]
    await collect(engine, "fine", request_id="inline-count-ok")
    await _failure(engine, "forbidden-topic", "inline-count-no")
    stream = engine.generate("wait @hang", request_id="inline-abort")
    task = asyncio.ensure_future(collect_all(stream))
    await wait_for(lambda: stage_active(engine, 1, "inline-abort"))
    await engine.abort("inline-abort")
    final = (await task)[-1]
    assert final.finish_reason == "abort"
    after = (await engine.stage_stats())[0]
    assert after["submitted"] - before["submitted"] == 3
    assert after["completed"] - before["completed"] == 2
    assert after["failed"] - before["failed"] == 1
    assert after["active"] == []
    assert "inline-abort" in after["aborts"]

    async def cancelled_in_the_thinker() -> bool:
        return "inline-abort" in (await engine.stage_stats())[1]["cancelled"]

    await wait_for(cancelled_in_the_thinker)


async def collect_all(stream: AsyncIterator[Any]) -> list[Any]:
    return [output async for output in stream]


async def test_engine_dead_in_an_inline_stage_kills_the_engine(
    pipeline_dir: Path, failing_guardrail: dict[str, Any]
) -> None:
    failing_guardrail["exc"] = EngineDeadError("guardrail lost its model")
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, _pipeline(process=False))
    )
    try:
        error = await _failure(engine, f"x {MARKER}", "inline-dead")
        assert isinstance(error, OmniEngineDeadError) and error.stage_id == 0
        assert engine.errored and error.details.fatal
        later = await _failure(engine, "hello", "inline-after-death")
        assert isinstance(later, OmniEngineDeadError) and later.stage_id == 0
    finally:
        engine.shutdown()
