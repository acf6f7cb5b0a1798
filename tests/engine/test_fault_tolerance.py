"""A faulted stage is neither dead nor silent (docs/design.md §11).

A ``vllm`` stage over the stand-in of vLLM 0.34's fault-tolerant engine
(``tests/engine/fault_tolerant_llm.py``) in the orchestrator's process: its
engine's status is read every watch tick (a stage process sends it with its
heartbeat: ``tests/e2e/test_fault_tolerance_drill.py``). While it is faulted,
a request that needs it is refused at once with the faulted record naming it
(before the guardrail in front of it runs), one held there fails with a
retryable 503 with its ``stage_id`` (never a finish), ``faulted_stages``
names it; the server drives the recovery (``retry`` through the engine's own
``handle_fault``, one at a time, with a request id), after which requests
are served again; ``vllm_omni:stage_status`` and the recovery counters show
each step. A stage whose engine gives up (status ``dead``) kills the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import vllm.exceptions

from tests.engine.engines import (
    collect,
    drain,
    stage_active,
    wait_for,
    write_pipeline,
)
from tests.engine.fault_tolerant_llm import REPLY, FaultTolerantLLM
from tests.prom import local_text, value
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    OmniConflictError,
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    VLLMNotFoundError,
    VLLMValidationError,
)
from vllm_omni.errors.render import retry_headers, should_retry
from vllm_omni.stages import STAGE_KINDS

pytestmark = pytest.mark.timeout(120)

STAGE_ID = 1
STAGE = str(STAGE_ID)
WINDOW_S = 30


def _pipeline(**engine_args: Any) -> dict[str, Any]:
    return {
        "model": "omni-fault-tolerant",
        "stages": [
            {"id": 0, "name": "guardrail", "kind": "guardrail"},
            {
                "id": STAGE_ID,
                "name": "thinker",
                "kind": "vllm",
                "in_process": True,
                "timeout_s": 10,
                "options": {
                    "engine_args": {
                        "model": "stand-in",
                        "recovery_s": 0.5,
                        "window_s": WINDOW_S,
                        **engine_args,
                    }
                },
            },
        ],
        "guardrail": {"blocklist": ["forbidden-topic"]},
    }


@pytest.fixture(scope="module")
def stand_in() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(
            STAGE_KINDS,
            "vllm",
            "tests.engine.fault_tolerant_llm:FaultTolerantVLLMStage",
        )
        yield


@pytest_asyncio.fixture(loop_scope="session")
async def engine(
    pipeline_dir: Path, stand_in: None
) -> AsyncIterator[tuple[AsyncOmni, FaultTolerantLLM]]:
    omni = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, _pipeline()))
    yield omni, FaultTolerantLLM.built[-1]
    omni.shutdown()


def _status(name: str) -> float:
    return value(local_text(), "vllm_omni:stage_status", stage=STAGE, status=name)


async def _until(predicate: Any) -> None:
    async def check() -> bool:
        return bool(predicate())

    await wait_for(check, timeout_s=10)


async def test_a_fault_is_refused_held_failed_recovered_and_counted(
    engine: tuple[AsyncOmni, FaultTolerantLLM],
) -> None:
    omni, llm = engine
    assert _status("healthy") == 1
    assert (
        value(local_text(), "vllm_omni:stage_recovery_window_seconds", stage=STAGE) == 0
    )
    ok = await collect(omni, "before", request_id="ft-before")
    assert ok[-1].text == "".join(REPLY) and ok[-1].finish_reason == "length"
    before = local_text()

    # A request held at the stage when it faults fails, retryable, with the
    # stage's id; so does the one whose step faulted the engine.
    held = asyncio.ensure_future(
        drain(omni.generate("wait @hang", request_id="ft-held", modalities=["text"]))
    )
    await wait_for(lambda: stage_active(omni, STAGE_ID, "ft-held"))
    with pytest.raises(OmniServiceUnavailableError) as trigger:
        await collect(omni, "boom @fault", request_id="ft-trigger")
    assert trigger.value.details.stage_id == STAGE_ID
    with pytest.raises(OmniServiceUnavailableError) as in_flight:
        await held
    for error in (trigger.value, in_flight.value):
        details = error.details  # type: ignore[attr-defined]
        assert (details.status_code, details.stage_id) == (503, STAGE_ID)
        assert should_retry(details) and not details.faulted

    # While it is faulted: refused at once, before the guardrail runs.
    await _until(lambda: omni.faulted_stages())
    assert [stage.id for stage in omni.faulted_stages()] == [STAGE_ID]
    guardrail_before = (await omni.stage_stats())[0]["submitted"]
    with pytest.raises(OmniServiceUnavailableError) as refused:
        await collect(omni, "during", request_id="ft-during")
    upstream = getattr(vllm.exceptions, "EngineFaultedError", None)
    if upstream is not None:  # vLLM 0.34: upstream's class, by identity
        assert isinstance(refused.value, upstream)
    details = refused.value.details  # type: ignore[attr-defined]
    assert details.faulted and (details.status_code, details.stage_id) == (
        503,
        STAGE_ID,
    )
    assert details.request_id == "ft-during"
    assert "Stage 1 (thinker) has faulted" in details.message
    assert 1 <= details.retry_after_s <= WINDOW_S
    assert dict(retry_headers(details))["Retry-After"] == str(details.retry_after_s)
    assert (await omni.stage_stats())[0]["submitted"] == guardrail_before
    faulted_metrics = local_text()
    assert any(
        value(faulted_metrics, "vllm_omni:stage_status", stage=STAGE, status=s) == 1
        for s in ("diagnosing", "unhealthy")
    )
    assert (
        value(faulted_metrics, "vllm_omni:stage_recovery_window_seconds", stage=STAGE)
        == WINDOW_S
    )
    status = {s["stage_id"]: s for s in omni.fault_tolerance_status()}
    assert status[STAGE_ID]["fault_tolerance"] and not status[0]["fault_tolerance"]
    assert status[STAGE_ID]["engines"][0]["status"] in ("diagnosing", "unhealthy")

    # The server drives the recovery: one retry, with a request id.
    await _until(lambda: not omni.faulted_stages())
    assert [(i.instruction, bool(i.request_id)) for i in llm.instructions] == [
        ("retry", True)
    ]
    after = await collect(omni, "after", request_id="ft-after")
    assert after[-1].text == "".join(REPLY)
    text = local_text()
    assert value(text, "vllm_omni:stage_status", stage=STAGE, status="healthy") == 1
    assert value(text, "vllm_omni:stage_faulted_seconds", stage=STAGE) == 0
    recovered = ("vllm_omni:stage_recoveries_total",)
    assert (
        value(text, *recovered, stage=STAGE, outcome="succeeded")
        - value(before, *recovered, stage=STAGE, outcome="succeeded")
        == 1
    )
    last = {s["stage_id"]: s for s in omni.fault_tolerance_status()}[STAGE_ID]
    assert last["last_recovery"]["success"] and last["recovering"] is None
    assert not omni.errored


async def test_one_recovery_at_a_time_and_only_while_unhealthy(
    engine: tuple[AsyncOmni, FaultTolerantLLM],
) -> None:
    omni, llm = engine
    await _until(lambda: omni.fault_tolerance_status()[1]["fault_tolerance"])
    with pytest.raises(OmniConflictError, match="healthy"):
        omni.apply_fault_instruction(STAGE_ID, "retry", {}, "op-1")
    with pytest.raises(VLLMValidationError) as unknown:
        omni.apply_fault_instruction(STAGE_ID, "reboot", {}, "op-2")
    assert unknown.value.details.parameter == "instruction"  # type: ignore[attr-defined]
    with pytest.raises(VLLMNotFoundError) as no_ft:
        omni.apply_fault_instruction(0, "retry", {}, "op-3")
    assert no_ft.value.details.status_code == 404  # type: ignore[attr-defined]
    llm.fault()
    await _until(lambda: llm.status == "unhealthy")
    await _until(
        lambda: {s["stage_id"]: s for s in omni.fault_tolerance_status()}[STAGE_ID][
            "recovering"
        ]
    )
    with pytest.raises(OmniConflictError, match="one recovery at a time"):
        omni.apply_fault_instruction(STAGE_ID, "retry", {}, "op-4")
    await _until(lambda: not omni.faulted_stages())
    assert [i.request_id for i in llm.instructions].count("op-4") == 0


async def test_an_engine_that_gives_up_kills_the_engine(
    pipeline_dir: Path, stand_in: None
) -> None:
    omni = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, _pipeline(window_s=1, recovery_s=5))
    )
    try:
        llm = FaultTolerantLLM.built[-1]
        llm.fault()
        await _until(lambda: omni.errored)
        assert isinstance(omni.dead_error, OmniEngineDeadError)
        assert omni.dead_error.stage_id == STAGE_ID
        assert _status("dead") == 1
    finally:
        omni.shutdown()


def test_the_apply_routes_instructions_are_the_engines() -> None:
    """``/openapi.json`` offers exactly the instructions the server starts."""
    from typing import get_args

    from vllm_omni.engine.fault_tolerance import INSTRUCTIONS
    from vllm_omni.entrypoints.openai.protocol import FaultToleranceApplyRequest

    annotation = FaultToleranceApplyRequest.model_fields["instruction"].annotation
    assert set(get_args(annotation)) == INSTRUCTIONS
