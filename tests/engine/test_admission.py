"""Overload: nothing lost on the stage wire, refusals at admission (§9).

The burst is the operator's report: two heavy image requests (n=10,
1024x1024) at the head, then 3,000 small ones with 2 kB prompts (so the
kernel's socket buffer cannot absorb what the high-water marks refuse).
Before the fix the stage received exactly 2,000 (its DEALER's receive HWM
plus the ROUTER's send HWM); the ROUTER silently dropped the rest: 504 after
``timeout_s``, or a wait forever without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import pickle
from collections.abc import AsyncIterator, Coroutine
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from vllm.exceptions import QueueOverflowError

from tests.engine.engines import drain, wait_for, write_pipeline
from tests.prom import local
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import OmniServerError, VLLMValidationError, normalize
from vllm_omni.errors.types import RemoteQueueOverflowError
from vllm_omni.outputs import OmniRequestOutput

pytestmark = pytest.mark.timeout(180)

HEAVY = {"n": 10, "size": "1024x1024"}
SMALL = {"size": "64x64"}
BURST = 3000
PADDING = "x" * 2000


def image_pipeline(timeout_s: float | None) -> dict[str, Any]:
    stage: dict[str, Any] = {"id": 0, "name": "image", "kind": "image"}
    if timeout_s is not None:
        stage["timeout_s"] = timeout_s
    return {"model": "omni-burst", "stages": [stage]}


@pytest_asyncio.fixture
async def limited_engine(pipeline_dir: Path) -> AsyncIterator[AsyncOmni]:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, image_pipeline(20)),
        max_num_queued_reqs=4,
    )
    yield engine
    engine.shutdown()


async def image(engine: AsyncOmni, index: int, params: dict[str, Any]) -> int:
    final = await drain(
        engine.generate(
            f"burst {index} {PADDING}",
            request_id=f"burst-{index}",
            modalities="image",
            params=params,
        )
    )
    assert final.diffusion is not None
    return len(final.diffusion.images)


@pytest.mark.parametrize("timeout_s", [20.0, None], ids=["timeout_s=20", "no-timeout"])
async def test_burst_behind_a_heavy_head_loses_nothing(
    pipeline_dir: Path, timeout_s: float | None
) -> None:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, image_pipeline(timeout_s)),
        max_num_queued_reqs=BURST + 2,
    )
    try:
        params = [HEAVY, HEAVY] + [SMALL] * BURST
        async with asyncio.timeout(120):  # without the fix: forever
            counts = await asyncio.gather(
                *(image(engine, i, p) for i, p in enumerate(params)),
                return_exceptions=True,
            )
        failures = [c for c in counts if isinstance(c, BaseException)]
        assert failures == []
        assert counts == [10, 10] + [1] * BURST
        stats = (await engine.stage_stats())[0]
        assert stats is not None
        # What the stage received equals what was sent.
        assert (stats["submitted"], stats["completed"], stats["failed"]) == (
            BURST + 2,
            BURST + 2,
            0,
        )
    finally:
        engine.shutdown()


async def test_admission_refuses_beyond_the_limit_at_once(
    limited_engine: AsyncOmni,
) -> None:
    rejected_before = local(
        "vllm_omni:admission_rejections_total", reason="max_num_queued_reqs", stage=""
    )
    before = (await limited_engine.stage_stats())[0]
    assert before is not None
    params = [HEAVY, HEAVY] + [SMALL] * 10
    results = await asyncio.gather(
        *(image(limited_engine, i, p) for i, p in enumerate(params)),
        return_exceptions=True,
    )
    # Tasks start in order: the first four are admitted, the rest refused.
    assert results[:4] == [10, 10, 1, 1]
    refused = results[4:]
    # Upstream's QueueOverflowError does not pickle, so callers get it
    # rebuilt as a class that does (still a QueueOverflowError and 0.30's
    # OmniServerError), with the original as its cause.
    assert all(
        type(error) is RemoteQueueOverflowError
        and isinstance(error, QueueOverflowError | OmniServerError)
        and type(error.__cause__) is QueueOverflowError
        for error in refused
    )
    clone = pickle.loads(pickle.dumps(refused[0]))
    assert type(clone) is RemoteQueueOverflowError
    assert clone.details == refused[0].details
    assert clone.http_status == HTTPStatus.SERVICE_UNAVAILABLE
    details = normalize(refused[0])
    assert (details.status_code, details.category, details.error_type) == (
        503,
        "server",
        "Service Unavailable",
    )
    assert (
        local(
            "vllm_omni:admission_rejections_total",
            reason="max_num_queued_reqs",
            stage="",
        )
        == rejected_before + 8
    )
    after = (await limited_engine.stage_stats())[0]
    assert after is not None
    assert after["submitted"] - before["submitted"] == 4
    assert local("vllm_omni:requests_in_flight") == 0
    # Capacity is back: the next request is admitted.
    assert await image(limited_engine, 99, SMALL) == 1


async def test_max_num_queued_reqs_is_validated() -> None:
    with pytest.raises(VLLMValidationError) as info:
        AsyncOmni("reference", max_num_queued_reqs=0)
    assert info.value.parameter == "max_num_queued_reqs"


# The guardrail, then an image stage that holds two requests at most; a
# prompt with ``@slow`` stays in that stage until it is aborted.
STAGE_LIMIT = 2
STAGE_LIMITED = {
    "model": "omni-stage-limit",
    "stages": [
        {"id": 0, "name": "guardrail", "kind": "guardrail"},
        {
            "id": 1,
            "name": "image",
            "kind": "image",
            "timeout_s": 120,
            "max_num_queued_reqs": STAGE_LIMIT,
        },
    ],
    "faults": [{"stage": 1, "marker": "@slow", "action": "hang"}],
}


def _rejections(stage: str) -> float:
    return local(
        "vllm_omni:admission_rejections_total",
        reason="max_num_queued_reqs",
        stage=stage,
    )


def _aborts() -> dict[str, float]:
    return {
        reason: local("vllm_omni:aborts_total", reason=reason)
        for reason in ("client_disconnect", "cancelled", "abort", "timeout")
    }


async def test_a_full_stage_refuses_at_once_and_keeps_nothing_behind(
    pipeline_dir: Path,
) -> None:
    engine = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, STAGE_LIMITED)
    )
    try:
        before = await engine.stage_stats()
        stage_before, engine_before = _rejections("1"), _rejections("")
        aborts_before = _aborts()
        burst = 8
        ids = [f"slow-{i}" for i in range(burst)]

        async def one(request_id: str) -> OmniRequestOutput:
            return await drain(
                engine.generate(
                    f"{request_id} @slow", request_id=request_id, modalities="image"
                )
            )

        tasks = {rid: asyncio.create_task(one(rid)) for rid in ids}

        async def refused_all() -> bool:
            return sum(t.done() for t in tasks.values()) == burst - STAGE_LIMIT

        await wait_for(refused_all, timeout_s=30)
        refused = sorted(rid for rid, t in tasks.items() if t.done())
        held = sorted(rid for rid, t in tasks.items() if not t.done())
        assert len(held) == STAGE_LIMIT
        for rid in refused:
            error = tasks[rid].exception()
            assert type(error) is RemoteQueueOverflowError
            assert type(error.__cause__) is QueueOverflowError
            details = error.details
            assert (
                details.status_code,
                details.category,
                details.error_type,
                details.stage_id,
                details.request_id,
            ) == (503, "server", "Service Unavailable", 1, rid)
        after = await engine.stage_stats()
        guardrail, image_stage = after[0], after[1]
        assert guardrail is not None and image_stage is not None
        assert before[0] is not None and before[1] is not None
        # Every request went through the guardrail; the image stage received
        # exactly the two it admitted, and holds them.
        assert guardrail["submitted"] - before[0]["submitted"] == burst
        assert image_stage["submitted"] - before[1]["submitted"] == STAGE_LIMIT
        assert image_stage["active"] == held
        # The refused ones were aborted in every stage; nothing stays behind.
        assert guardrail["active"] == []
        assert set(refused) <= set(guardrail["aborts"])
        assert _rejections("1") - stage_before == burst - STAGE_LIMIT
        assert _rejections("") == engine_before
        # A refusal is not an abort of anyone's making.
        assert _aborts() == aborts_before
        assert local("vllm_omni:requests_in_flight") == STAGE_LIMIT

        for rid in held:
            tasks[rid].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        # Capacity is back: the next request is admitted and served.
        final = await drain(engine.generate("small", modalities="image", params=SMALL))
        assert final.diffusion is not None and len(final.diffusion.images) == 1
        assert local("vllm_omni:requests_in_flight") == 0
    finally:
        engine.shutdown()


async def _elsewhere(coroutine: Coroutine[Any, Any, int]) -> int:
    """Another request's call: in a context of its own, not the holder's."""
    return await asyncio.create_task(coroutine, context=contextvars.Context())


async def test_a_held_place_counts_until_the_request_is_admitted(
    limited_engine: AsyncOmni,
) -> None:
    """Issue 46: a place held by a route that passed the early check counts
    against the limit until that request reaches ``generate`` (where it is
    counted as in flight instead, not twice) or the route ends."""
    with contextlib.ExitStack() as others:
        for i in range(3):
            others.enter_context(limited_engine.hold_admission(f"held-{i}"))
        with limited_engine.hold_admission("held-3"):
            # Four places held: another request is refused, early or in
            # generate.
            with pytest.raises(QueueOverflowError):
                limited_engine.check_admission("over")
            with pytest.raises(QueueOverflowError):
                await _elsewhere(image(limited_engine, 98, SMALL))
            # The holder itself is admitted: its place becomes its slot.
            assert await image(limited_engine, 4, SMALL) == 1
            # Its place was given back once, when it was admitted: three
            # held, one free.
            assert await _elsewhere(image(limited_engine, 5, SMALL)) == 1
        # Leaving the context gives back nothing more.
        with limited_engine.hold_admission("fourth"):
            with pytest.raises(QueueOverflowError):
                limited_engine.check_admission("over")
    # Every place given back: the limit is whole again.
    with contextlib.ExitStack() as held:
        for i in range(4):
            held.enter_context(limited_engine.hold_admission(f"again-{i}"))
        with pytest.raises(QueueOverflowError):
            limited_engine.hold_admission("fifth")
    assert local("vllm_omni:requests_in_flight") == 0
