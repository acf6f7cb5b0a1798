"""A ``vllm`` stage in the orchestrator's process (``in_process: true``).

The stage is upstream's bridge (``VLLMStage``) over a fake ``AsyncLLM``
(``tests/engine/fake_async_llm.py``; the real engine runs in
``tests/real_engine/test_real_in_process.py``). The contract holds as for a
stage process: one record per failure with the stage's id, a deadline is a
504 that aborts the request in the engine, a consumer that goes away and
``abort()`` close the engine's stream, an engine that dies (with or without
a request in flight) kills the engine with its stage id, ``stage_stats``
answers, the engine's ``vllm:`` metrics carry the ``stage`` label (no
gauges once it is dead), and shutdown shuts the engine down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import vllm.exceptions
from prometheus_client import REGISTRY

from tests.engine.engines import collect, drain, wait_for, write_pipeline
from tests.engine.fake_async_llm import REPLY, FakeAsyncLLM
from tests.prom import local_text, samples, value
from vllm_omni.config import load_pipeline
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMValidationError,
)
from vllm_omni.errors.render import should_retry
from vllm_omni.stages import STAGE_KINDS
from vllm_omni.stages.vllm_backend import ENGINE_ABORTED

pytestmark = pytest.mark.timeout(120)

STAGE_ID = 1
MODEL = "omni-in-process"


def _pipeline(model: str = MODEL, **stage: Any) -> dict[str, Any]:
    return {
        "model": model,
        "stages": [
            {"id": 0, "name": "guardrail", "kind": "guardrail", "timeout_s": 5},
            {
                "id": STAGE_ID,
                "name": "thinker",
                "kind": "vllm",
                "in_process": True,
                "timeout_s": 1.5,
                "options": {"engine_args": {"model": "fake"}},
                **stage,
            },
        ],
    }


@pytest.fixture(scope="module")
def fake_vllm() -> Iterator[None]:
    """``kind: vllm`` builds the bridge over the fake engine (in this
    process only: a stage process would build the real one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(STAGE_KINDS, "vllm", "tests.engine.fake_async_llm:FakeVLLMStage")
        yield


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(
    pipeline_dir: Path, fake_vllm: None
) -> AsyncIterator[tuple[AsyncOmni, FakeAsyncLLM]]:
    omni = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, _pipeline()))
    yield omni, FakeAsyncLLM.built[-1]
    omni.shutdown()


async def _failure(omni: AsyncOmni, prompt: str, request_id: str) -> BaseException:
    with pytest.raises(Exception) as info:
        await collect(omni, prompt, request_id=request_id)
    return info.value


async def _engine_has(fake: FakeAsyncLLM, request_id: str) -> None:
    async def holds() -> bool:
        return fake.running._value.get() > 0  # the fake's own gauge

    await wait_for(holds)


async def _hanging(
    omni: AsyncOmni, fake: FakeAsyncLLM, request_id: str
) -> asyncio.Future[Any]:
    """A request the engine holds (it never ends by itself), drained by a task."""
    stream = omni.generate("x @hang", request_id=request_id, modalities=["text"])
    task = asyncio.ensure_future(drain(stream))
    await _engine_has(fake, request_id)
    return task


async def _in_engine(fake: FakeAsyncLLM, request_id: str) -> None:
    """Wait until the engine's stream of ``request_id`` started."""

    async def started() -> bool:
        return request_id in fake.tasks

    await wait_for(started)


async def _closed_in_engine(fake: FakeAsyncLLM, request_id: str) -> None:
    """Wait until the engine's stream of ``request_id`` was closed (an abort)."""

    async def closed() -> bool:
        return request_id in fake.closed

    await wait_for(closed)


async def test_the_stage_streams_from_the_engines_process(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, _ = engine
    assert omni.stage_pids()[STAGE_ID] is None
    outputs = await collect(omni, "hello", request_id="ip-hello")
    assert [o.text_delta for o in outputs[:-1]] == list(REPLY)
    assert outputs[-1].finished and outputs[-1].text == "".join(REPLY)
    assert outputs[-1].finish_reason == "length"
    stats = (await omni.stage_stats())[STAGE_ID]
    assert stats is not None and stats["pid"] == os.getpid()
    assert stats["kind"] == "vllm" and stats["active"] == []


async def test_an_engine_refusal_is_the_clients_400_with_its_parameter(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, _ = engine
    error = await _failure(omni, "x @reject", "ip-reject")
    assert isinstance(error, VLLMValidationError)
    details = error.details  # type: ignore[attr-defined]
    assert (details.status_code, details.parameter) == (400, "top_k")
    assert (details.stage_id, details.request_id) == (STAGE_ID, "ip-reject")
    assert not omni.errored


async def test_an_engine_abort_nobody_asked_for_is_a_retryable_503(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """The engine ends the stream with finish reason "abort" and no error
    (vLLM 0.34's fault tolerance, on a faulted engine): the caller gets a
    retryable 503 naming the stage, not a finished output with half the text
    (the real engine: tests/real_engine/test_real_in_process.py)."""
    omni, _ = engine
    error = await _failure(omni, "x @dropped", "ip-dropped")
    assert isinstance(error, OmniServiceUnavailableError)
    details = error.details  # type: ignore[attr-defined]
    assert (details.status_code, details.error_type, details.category) == (
        503,
        "ServiceUnavailableError",
        "server",
    )
    assert (details.stage_id, details.message) == (STAGE_ID, ENGINE_ABORTED)
    assert should_retry(details) and not omni.errored
    outputs = await collect(omni, "hello", request_id="ip-after-dropped")
    assert outputs[-1].finish_reason == "length"


@pytest.mark.skipif(
    not hasattr(vllm.exceptions, "EngineFaultedError"),
    reason="the installed vLLM has no EngineFaultedError (0.34+)",
)
async def test_an_engine_faulted_error_reaches_the_caller_as_its_class(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, _ = engine
    faulted = vllm.exceptions.EngineFaultedError  # type: ignore[attr-defined]
    error = await _failure(omni, "x @faulted", "ip-faulted")
    assert isinstance(error, faulted)
    details = error.details  # type: ignore[attr-defined]
    assert details.faulted and (details.status_code, details.stage_id) == (
        503,
        STAGE_ID,
    )
    assert (details.error_type, details.request_id) == (
        "ServiceUnavailableError",
        "ip-faulted",
    )
    assert pickle.loads(pickle.dumps(error)).details == details
    assert not omni.errored


async def test_a_deadline_is_a_504_and_aborts_the_request_in_the_engine(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, fake = engine
    error = await _failure(omni, "x @hang", "ip-deadline")
    assert isinstance(error, OmniStageTimeoutError)
    assert error.details.status_code == 504 and error.details.stage_id == STAGE_ID
    await _closed_in_engine(fake, "ip-deadline")
    stats = (await omni.stage_stats())[STAGE_ID]
    assert "ip-deadline" in stats["cancelled"] and stats["active"] == []


async def test_a_consumer_that_goes_away_aborts_the_request_in_the_engine(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, fake = engine
    task = await _hanging(omni, fake, "ip-gone")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _closed_in_engine(fake, "ip-gone")
    assert "ip-gone" in (await omni.stage_stats())[STAGE_ID]["cancelled"]


async def test_abort_ends_the_stream_and_the_engines_request(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, fake = engine
    task = await _hanging(omni, fake, "ip-abort")
    await omni.abort("ip-abort")
    final = await task
    assert final.finish_reason == "abort"
    await _closed_in_engine(fake, "ip-abort")
    assert not omni.errored


async def test_the_engines_metrics_carry_the_stage_label(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    omni, _ = engine
    await collect(omni, "count me", request_id="ip-metrics")
    text = local_text()
    labels = {"model_name": MODEL, "engine": "0", "stage": str(STAGE_ID)}
    assert value(text, "vllm:request_success_total", **labels) >= 1
    assert ("vllm:num_requests_running", frozenset(labels.items())) in samples(text)
    # Only with the stage label: the engine's own series left the registry.
    unlabelled = {"model_name": MODEL, "engine": "0"}
    assert ("vllm:num_requests_running", frozenset(unlabelled.items())) not in (
        samples(text)
    )
    # A family the engine registers after its start (vLLM 0.34's render
    # histogram, on the first render) carries the label too, and only it.
    render = [
        dict(labels)
        for (name, labels), _ in samples(text).items()
        if name == "vllm:request_render_duration_seconds_count"
    ]
    assert render and all(r.get("stage") == str(STAGE_ID) for r in render)


async def test_another_engine_in_the_process_keeps_its_metrics_and_ours_serve(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """A caller's own ``AsyncLLM`` built in the same process after ours (a
    notebook, the benchmark's baseline) registers the same ``vllm:``
    families on the default registry. Seen in bench_real_engine: the
    stage's late adoption took them, failed on the duplicate names at every
    request's end, and the request's task ended in that error."""
    omni, _ = engine
    await collect(omni, "first", request_id="ip-before-other")
    before = set(REGISTRY._collector_to_names)
    other = FakeAsyncLLM({"served_model_name": "other"})
    registered = set(REGISTRY._collector_to_names) - before
    theirs = {"model_name": "other", "engine": "0"}
    try:
        other.success.inc()
        for index in range(3):
            outputs = await asyncio.wait_for(
                collect(omni, "count me", request_id=f"ip-beside-other-{index}"), 5
            )
            assert "".join(o.text_delta or "" for o in outputs) == "".join(REPLY)
        # Theirs stay on the default registry, unlabelled by any stage of
        # ours; ours keep the stage label.
        assert registered <= set(REGISTRY._collector_to_names)
        assert value(local_text(), "vllm:request_success_total", **theirs) == 1
        ours = {"model_name": MODEL, "engine": "0", "stage": str(STAGE_ID)}
        assert value(local_text(), "vllm:request_success_total", **ours) >= 4
    finally:
        FakeAsyncLLM.built.remove(other)
        for collector in registered:
            with contextlib.suppress(KeyError):
                REGISTRY.unregister(collector)


@pytest.mark.parametrize("in_flight", [True, False], ids=["in-flight", "idle"])
async def test_an_engine_that_dies_kills_the_engine_with_the_stage_id(
    pipeline_dir: Path, fake_vllm: None, in_flight: bool
) -> None:
    """In flight, the requests it holds fail with it; idle, nothing but the
    watch can notice (a stage process would have exited)."""
    model = f"omni-dies-{'in-flight' if in_flight else 'idle'}"
    omni = await AsyncOmni.create(
        pipeline=write_pipeline(pipeline_dir, _pipeline(model))
    )
    fake = FakeAsyncLLM.built[-1]
    labels = {"model_name": model, "engine": "0", "stage": str(STAGE_ID)}
    try:
        await collect(omni, "count me", request_id=f"ip-ok-{in_flight}")
        if in_flight:
            held = asyncio.ensure_future(_failure(omni, "x @hang", "ip-held"))
            await _engine_has(fake, "ip-held")
            error = await _failure(omni, "x @die", "ip-die")
            assert isinstance(error, OmniEngineDeadError)
            assert error.stage_id == STAGE_ID and error.details.request_id == "ip-die"
            failed = await asyncio.wait_for(held, 5)
            assert isinstance(failed, OmniEngineDeadError)
            assert failed.stage_id == STAGE_ID
        else:
            fake.die()  # its EngineCore is gone, no request in flight

            async def dead() -> bool:
                return omni.errored

            await wait_for(dead, timeout_s=2)
        assert omni.dead_error is not None and omni.dead_error.stage_id == STAGE_ID
        later = await _failure(omni, "hello", f"ip-after-{in_flight}")
        assert isinstance(later, OmniEngineDeadError) and later.stage_id == STAGE_ID
        # A dead engine shows its counters, not its gauges.
        seen = samples(local_text())
        assert seen[("vllm:request_success_total", frozenset(labels.items()))] == 1
        assert ("vllm:num_requests_running", frozenset(labels.items())) not in seen
    finally:
        omni.shutdown()
    assert fake.was_shut_down
    # A shut-down engine's metrics leave /metrics with it.
    assert ("vllm:request_success_total", frozenset(labels.items())) not in (
        samples(local_text())
    )


async def test_a_drill_aimed_at_it_puts_it_in_a_process(pipeline_dir: Path) -> None:
    document = _pipeline(kind="text", options={})
    document["faults"] = [{"stage": STAGE_ID, "marker": "@x", "action": "raise"}]
    omni = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, document))
    try:
        assert omni.stage_pids()[STAGE_ID] not in (None, os.getpid())
        assert omni.stage_pids()[0] is None  # the guardrail stays here
    finally:
        omni.shutdown()


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ({"in_process": "yes"}, "in_process must be true or false"),
        ({"remote": True}, "set remote or in_process, not both"),
    ],
)
def test_in_process_is_checked(
    tmp_path: Path, stage: dict[str, Any], message: str
) -> None:
    path = write_pipeline(tmp_path, _pipeline(**stage))
    with pytest.raises(VLLMValidationError, match=message) as info:
        load_pipeline(str(path))
    assert info.value.parameter == f"stages[{STAGE_ID}].in_process"  # type: ignore[attr-defined]


async def test_the_stage_runs_in_the_task_that_reads_the_request(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """As upstream's ``AsyncLLM.generate`` runs in its caller's task: no task
    of its own, no hand-over between two (issue 47)."""
    omni, fake = engine

    async def read() -> asyncio.Task[Any] | None:
        await collect(omni, "hello", request_id="ip-task")
        return asyncio.current_task()

    reader = await asyncio.ensure_future(read())
    assert fake.tasks["ip-task"] is reader


async def test_an_abort_while_the_reader_waits_leaves_its_task_going_on(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """The abort cancels the reader's wait on the stage, then takes the
    cancellation back: the reader reads the abort's end and goes on."""
    omni, fake = engine

    async def read() -> tuple[str | None, int, str]:
        final = await drain(
            omni.generate("x @hang", request_id="ip-wait", modalities=["text"])
        )
        await asyncio.sleep(0.01)  # not cancelled: the abort was the stage's
        task = asyncio.current_task()
        assert task is not None
        return final.finish_reason, task.cancelling(), "went on"

    reader = asyncio.ensure_future(read())
    await _in_engine(fake, "ip-wait")
    await omni.abort("ip-wait")
    assert await reader == ("abort", 0, "went on")
    await _closed_in_engine(fake, "ip-wait")
    stats = (await omni.stage_stats())[STAGE_ID]
    assert "ip-wait" in stats["cancelled"] and "ip-wait" not in stats["active"]


async def test_an_abort_while_the_reader_is_elsewhere_does_not_touch_it(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """Between two outputs the reader's task is its own (a client's slow
    socket): an abort then cancels nothing of it; the stage's work is closed
    and the reader's next read is the abort's end."""
    omni, fake = engine
    elsewhere = asyncio.Event()
    stream = omni.generate("x @stall", request_id="ip-away", modalities=["text"])

    async def read() -> tuple[str | None, str | None]:
        first = await anext(stream)
        await elsewhere.wait()  # the reader busy with its own work
        rest = [output async for output in stream]
        return first.text_delta, rest[-1].finish_reason

    reader = asyncio.ensure_future(read())
    await _in_engine(fake, "ip-away")
    await omni.abort("ip-away")
    await asyncio.sleep(0.05)
    assert not reader.done()  # its own wait was not cancelled
    elsewhere.set()
    assert await reader == (REPLY[0], "abort")
    await _closed_in_engine(fake, "ip-away")
    assert "ip-away" in (await omni.stage_stats())[STAGE_ID]["cancelled"]


async def test_the_readers_own_cancellation_outlives_an_abort_at_once(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """A reader cancelled by its own caller while an abort cancels its wait
    too: only the abort's cancellation is taken back."""
    omni, fake = engine
    task = await _hanging(omni, fake, "ip-both")
    task.cancel()
    await omni.abort("ip-both")
    with pytest.raises(asyncio.CancelledError):
        await task
    await _closed_in_engine(fake, "ip-both")


async def _first_here_rest_in_a_task(
    omni: AsyncOmni, request_id: str
) -> tuple[str | None, asyncio.Task[Any]]:
    """A streamed response's reading: its first output in the route's task
    (here, the test's), the rest in another (the response's own)."""
    stream = omni.generate("x @stall", request_id=request_id, modalities=["text"])
    first = await anext(stream)
    return first.text_delta, asyncio.ensure_future(drain(stream))


async def test_a_reader_cancelled_in_the_task_it_moved_to_is_no_stage_failure(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """The task that reads on is the one whose cancellation is the reader's
    own: the client gone, not a 500 of the stage's (the soak's streams cut
    by their clients, with the real engine in process)."""
    omni, fake = engine
    failed = (await omni.stage_stats())[STAGE_ID]["failed"]
    first, rest = await _first_here_rest_in_a_task(omni, "ip-moved")
    assert first == REPLY[0]
    await _in_engine(fake, "ip-moved")
    await asyncio.sleep(0.01)  # the rest's task waits on the stage now
    rest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rest
    await _closed_in_engine(fake, "ip-moved")
    stats = (await omni.stage_stats())[STAGE_ID]
    assert stats["failed"] == failed
    assert "ip-moved" in stats["cancelled"] and "ip-moved" not in stats["active"]


async def test_an_abort_cancels_the_wait_of_the_task_that_reads_now(
    engine: tuple[AsyncOmni, FakeAsyncLLM],
) -> None:
    """An abort while the reader waits in the task it moved to cancels that
    wait and takes it back; the task that read first is not touched."""
    omni, fake = engine
    first, rest = await _first_here_rest_in_a_task(omni, "ip-moved-abort")
    assert first == REPLY[0]
    await _in_engine(fake, "ip-moved-abort")
    await asyncio.sleep(0.01)
    await omni.abort("ip-moved-abort")
    final = await rest
    assert final.finish_reason == "abort"
    here = asyncio.current_task()
    assert here is not None and here.cancelling() == 0
    await asyncio.sleep(0.01)  # nothing pending for this task either
    await _closed_in_engine(fake, "ip-moved-abort")
