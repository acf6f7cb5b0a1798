"""What ``AsyncOmni`` raises is what a response would say (issue 13).

Against real stage processes: every exception carries ``.details`` (the
record the server renders, with the request id), local ones included; a
fatal reason reaches every failed request; stage records are compact between
0.31 peers and keep the 0.30 shape with ``legacy_wire``.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.engines import collect, stage_active, wait_for, write_pipeline
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    GENERIC_SERVER_MESSAGE,
    OmniConflictError,
    OmniEngineDeadError,
    OmniErrorDetails,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMValidationError,
    normalize,
)

pytestmark = pytest.mark.timeout(60)


async def _raised(engine: AsyncOmni, prompt: Any, **kwargs: Any) -> BaseException:
    try:
        await collect(engine, prompt, **kwargs)
    except Exception as exc:
        return exc
    raise AssertionError("generate did not raise")


def _pickles(exc: BaseException) -> None:
    clone = pickle.loads(pickle.dumps(exc))
    assert type(clone) is type(exc) and clone.details == exc.details  # type: ignore[attr-defined]


async def test_local_validation_errors_carry_details(drill_engine: AsyncOmni) -> None:
    cases: list[tuple[Any, dict[str, Any], str]] = [
        ("x", {"request_id": "v-1", "modalities": ["smell"]}, "modalities"),
        ("x", {"request_id": "v-2", "modalities": 7}, "modalities"),
        (None, {"request_id": "v-3"}, "prompt"),
        (7, {"request_id": "v-4"}, "prompt"),
        ("x", {"request_id": "v-5", "params": {"seed": object()}}, "seed"),
    ]
    for prompt, kwargs, parameter in cases:
        exc = await _raised(drill_engine, prompt, **kwargs)
        assert type(exc) is VLLMValidationError, kwargs
        assert exc.details == OmniErrorDetails(  # type: ignore[attr-defined]
            exc.args[0],
            "client",
            400,
            "BadRequestError",
            parameter=parameter,
            request_id=kwargs["request_id"],
        )
        _pickles(exc)


@pytest.mark.parametrize("request_id", [42, b"r-1", ""])
async def test_a_request_id_must_be_a_non_empty_string(
    drill_engine: AsyncOmni, request_id: Any
) -> None:
    exc = await _raised(drill_engine, "x", request_id=request_id)
    assert type(exc) is VLLMValidationError
    assert exc.parameter == "request_id"
    assert exc.details.status_code == 400  # type: ignore[attr-defined]
    assert exc.details.parameter == "request_id"  # type: ignore[attr-defined]


async def test_a_missing_stage_is_a_503_with_details(drill_engine: AsyncOmni) -> None:
    exc = await _raised(drill_engine, "x", request_id="img-1", modalities=["image"])
    assert type(exc) is OmniServiceUnavailableError
    assert exc.details == OmniErrorDetails(  # type: ignore[attr-defined]
        "pipeline has no image stage",
        "server",
        503,
        "ServiceUnavailableError",
        request_id="img-1",
    )
    _pickles(exc)


async def test_a_duplicate_request_id_is_a_409_with_details(
    drill_engine: AsyncOmni,
) -> None:
    held = asyncio.create_task(
        collect(
            drill_engine, "a @talker-hang", request_id="dup-1", modalities=["audio"]
        )
    )
    try:
        await wait_for(lambda: stage_active(drill_engine, 2, "dup-1"))
        exc = await _raised(drill_engine, "b", request_id="dup-1")
        assert type(exc) is OmniConflictError
        assert exc.details == OmniErrorDetails(  # type: ignore[attr-defined]
            "A request with this id is already in flight.",
            "client",
            409,
            "ConflictError",
            request_id="dup-1",
        )
        _pickles(exc)
    finally:
        await drill_engine.abort("dup-1")
        outputs = await held
    assert outputs[-1].finish_reason == "abort"


async def test_the_orchestrator_deadline_carries_details(
    drill_engine: AsyncOmni,
) -> None:
    exc = await _raised(drill_engine, "x @hang", request_id="late-1")
    assert type(exc) is OmniStageTimeoutError
    assert exc.details == OmniErrorDetails(  # type: ignore[attr-defined]
        "Stage 1 (thinker) did not finish within 1 s.",
        "server",
        504,
        "GatewayTimeoutError",
        request_id="late-1",
        stage_id=1,
    )
    _pickles(exc)


async def test_stages_send_compact_records_once_welcomed(
    drill_engine: AsyncOmni,
) -> None:
    stats = await drill_engine.stage_stats()
    assert all(s is not None and s["compact_errors"] for s in stats.values())


async def test_a_legacy_wire_stage_is_not_welcomed(pipeline_dir: Path) -> None:
    document = {
        "model": "omni-legacy-wire",
        "stages": [{"id": 0, "name": "old", "kind": "text", "legacy_wire": True}],
    }
    engine = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, document))
    try:
        stats = await engine.stage_stats()
        assert stats[0] is not None and stats[0]["compact_errors"] is False
    finally:
        engine.shutdown()


# -- fatal reasons --------------------------------------------------------------

FATAL_REASON = {
    "model": "omni-fatal-reason",
    "stages": [
        {"id": 0, "name": "thinker", "kind": "text"},
        {"id": 1, "name": "talker", "kind": "talker"},
        {"id": 2, "name": "vocoder", "kind": "vocoder"},
    ],
    "faults": [
        {
            "stage": 1,
            "marker": "@gpu",
            "action": "raise",
            "exception": "vllm_omni.errors:OmniEngineDeadError",
            "kwargs": {"stage_id": 1, "reason": "gpu fell off at /dev/nvidia0"},
        },
        {"stage": 1, "marker": "@hang", "action": "hang"},
    ],
}


@pytest.fixture
async def fatal_engine(pipeline_dir: Path) -> AsyncIterator[AsyncOmni]:
    engine = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, FATAL_REASON))
    yield engine
    engine.shutdown()


async def test_a_fatal_reason_reaches_every_failed_request(
    fatal_engine: AsyncOmni,
) -> None:
    bystander = asyncio.create_task(
        collect(fatal_engine, "b @hang", request_id="bystander", modalities=["audio"])
    )
    await wait_for(lambda: stage_active(fatal_engine, 1, "bystander"))
    async with asyncio.timeout(5.0):
        trigger = await _raised(
            fatal_engine, "a @gpu", request_id="trigger", modalities=["audio"]
        )
        other = await asyncio.gather(bystander, return_exceptions=True)
    reason = "gpu fell off at <path>"  # sanitized in the stage
    for request_id, exc in (("trigger", trigger), ("bystander", other[0])):
        assert type(exc) is OmniEngineDeadError, request_id
        assert (exc.stage_id, exc.reason) == (1, reason)
        assert str(exc).endswith(f"Stage 1 died ({reason})")
        assert exc.details == OmniErrorDetails(
            GENERIC_SERVER_MESSAGE,
            "server",
            500,
            "InternalServerError",
            request_id=request_id,
            stage_id=1,
            fatal=True,
        )
        assert normalize(exc) == exc.details
        clone = pickle.loads(pickle.dumps(exc))
        assert (clone.reason, clone.details) == (exc.reason, exc.details)
    assert fatal_engine.dead_error.reason == reason  # type: ignore[attr-defined]
    with pytest.raises(OmniEngineDeadError) as after:
        await fatal_engine.check_health()
    assert after.value.reason == reason
    assert after.value.details is not None and after.value.details.fatal


async def test_calls_after_shutdown_are_503(pipeline_dir: Path) -> None:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(
            pipeline_dir,
            {"model": "m", "stages": [{"id": 0, "name": "t", "kind": "text"}]},
        )
    )
    engine.shutdown()
    exc = await _raised(engine, "x", request_id="closed-1")
    assert type(exc) is OmniServiceUnavailableError
    assert exc.details is not None  # type: ignore[attr-defined]
    assert (exc.details.status_code, exc.details.request_id) == (503, "closed-1")  # type: ignore[attr-defined]
