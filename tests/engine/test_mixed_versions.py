"""The mixed-version drill: 0.30 and this tree on one stage wire (issue 22).

Both directions, with real stage processes and real ZMQ sockets:

- **an orchestrator of this tree, one stage speaking only 0.30's record**:
  a stage with ``legacy_wire: true`` (this tree's legacy encoder, forked as
  usual), or a remote stage process whose records are 0.30's own Struct in
  0.30's shapes (``tests/engine/stage_030.py``; a death is ``fatal=True``
  with no status);
- **a stage of this tree under a strict 0.30 orchestrator**: the stage runs
  with ``legacy_wire: true``; the orchestrator end is a ROUTER socket here
  that decodes each error with 0.30's strict ``ErrorMessage`` and hands it
  to 0.30's own ``OmniBase._handle_output_message`` (both executed from the
  wheel, running against this package as after the drop-in).

A client error, a stage's own failure and a death each keep their owner,
status, stage and fatality across the boundary; a fatal record marks the
engine dead and fails the requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from tests.engine.engines import collect, stage_active, wait_for, write_pipeline
from tests.wheel030 import class_030, function_030, messages_030, tree_030
from vllm_omni.config import load_pipeline
from vllm_omni.engine import processes
from vllm_omni.engine.stage_worker import WorkerSpec
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    EngineDeadError,
    OmniClientError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    VLLMNotFoundError,
    raise_client_error_or,
)
from vllm_omni.errors.details import GENERIC_SERVER_MESSAGE
from vllm_omni.wire import messages as m

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
OLD = 0  # the stage that speaks 0.30
FAULTS = [
    {
        "stage": OLD,
        "marker": "@client",
        "action": "raise",
        "exception": "vllm_omni.errors:VLLMNotFoundError",
        "args": ["no such voice"],
    },
    {"stage": OLD, "marker": "@server", "action": "raise"},
    {
        "stage": OLD,
        "marker": "@dead",
        "action": "raise",
        "exception": "vllm_omni.errors:OmniEngineDeadError",
        "kwargs": {"stage_id": OLD, "reason": "gpu fell off"},
    },
    {"stage": 1, "marker": "@talker-hang", "action": "hang"},
]


def _pipeline(directory: Path, *, remote: bool) -> Path:
    return write_pipeline(
        directory,
        {
            "model": "omni-mixed",
            "stages": [
                {
                    "id": OLD,
                    "name": "thinker-030",
                    "kind": "text",
                    "legacy_wire": True,
                    "remote": remote,
                },
                {"id": 1, "name": "talker", "kind": "talker"},
                {"id": 2, "name": "vocoder", "kind": "vocoder"},
            ],
            "faults": FAULTS,
        },
    )


@contextlib.asynccontextmanager
async def _engine(directory: Path, speaker: str) -> AsyncIterator[AsyncOmni]:
    """An engine of this tree whose stage 0 speaks 0.30 (``speaker``)."""
    if speaker == "legacy_wire":
        engine = await AsyncOmni.create(pipeline=_pipeline(directory, remote=False))
        try:
            yield engine
        finally:
            engine.shutdown()
        return
    tree_030()  # skip here, with the reason, when the wheel cannot be had
    path = _pipeline(directory, remote=True)
    engine = AsyncOmni(pipeline=path, transport="tcp")
    starting = asyncio.create_task(engine.start())
    await wait_for(_when(lambda: bool(engine.address)))
    command = ["-m", "tests.engine.stage_030", "--connect", engine.address]
    stage = subprocess.Popen(
        [sys.executable, *command, "--pipeline", str(path), "--stage-id", str(OLD)],
        cwd=REPO,
    )
    try:
        async with asyncio.timeout(60):
            await starting
        yield engine
    finally:
        engine.shutdown()
        stage.kill()
        stage.wait()


def _when(condition: Any) -> Any:
    async def check() -> bool:
        return bool(condition())

    return check


@pytest.mark.parametrize("speaker", ["legacy_wire", "0.30 stage process"])
async def test_an_orchestrator_of_this_tree_reads_a_030_stage(
    pipeline_dir: Path, speaker: str
) -> None:
    async with _engine(pipeline_dir, speaker) as engine:
        with pytest.raises(VLLMNotFoundError) as client:
            await collect(engine, "say @client", request_id="mix-client")
        assert isinstance(client.value, OmniClientError)  # the 0.30 wrapper too
        details = client.value.details
        assert details is not None
        assert (details.category, details.status_code, details.error_type) == (
            "client",
            404,
            "NotFoundError",
        )
        assert (details.message, details.stage_id, details.fatal) == (
            "no such voice",
            OLD,
            False,
        )

        with pytest.raises(OmniEngineGenerateError) as server:
            await collect(engine, "say @server", request_id="mix-server")
        details = server.value.details
        assert details is not None
        assert (details.category, details.status_code, details.stage_id) == (
            "server",
            500,
            OLD,
        )
        assert details.message == GENERIC_SERVER_MESSAGE and not details.fatal
        assert not engine.errored  # a stage's own failure fails one request

        bystander = asyncio.create_task(
            collect(
                engine,
                "b @talker-hang",
                request_id="mix-bystander",
                modalities=["audio"],
            )
        )
        await wait_for(lambda: stage_active(engine, 1, "mix-bystander"))
        async with asyncio.timeout(5.0):
            with pytest.raises(OmniEngineDeadError) as dead:
                await collect(engine, "say @dead", request_id="mix-dead")
            (other,) = await asyncio.gather(bystander, return_exceptions=True)
        for request_id, exc in (("mix-dead", dead.value), ("mix-bystander", other)):
            assert type(exc) is OmniEngineDeadError, (request_id, exc)
            assert (exc.stage_id, exc.reason) == (OLD, "gpu fell off"), request_id
            assert exc.details is not None and exc.details.fatal
            assert exc.details.request_id == request_id
        assert engine.errored
        assert engine.dead_error.stage_id == OLD  # type: ignore[attr-defined]


# -- a stage of this tree, a strict 0.30 orchestrator -------------------------------


class _Strict030:
    """The orchestrator end of 0.30: its strict Struct and its own receiving
    code (``OmniBase._handle_output_message``), against this package."""

    def __init__(self) -> None:
        old = messages_030()
        self.ErrorMessage = old.ErrorMessage
        # 0.30's ``OmniEngineDeadError`` lives in its omni_base, not errors.py.
        self.OmniEngineDeadError = class_030(
            "entrypoints/omni_base.py",
            "OmniEngineDeadError",
            {"EngineDeadError": EngineDeadError},
        )
        names = {
            "ErrorMessage": old.ErrorMessage,
            "OmniEngineDeadError": self.OmniEngineDeadError,
            "raise_client_error_or": raise_client_error_or,
            # 0.30's other queue messages, which no error record is.
            "StageMetricsMessage": type("StageMetricsMessage", (), {}),
            "OutputMessage": type("OutputMessage", (), {}),
        }
        self.base = type(
            "OmniBase030",
            (),
            {
                name: function_030("entrypoints/omni_base.py", "OmniBase", name, names)
                for name in ("_handle_output_message", "_raise_nonfatal_error_message")
            },
        )()

    def receive(self, data: bytes) -> tuple[Any, BaseException]:
        """Decode strictly (unknown fields raise) and handle as 0.30 does."""
        message = msgspec.msgpack.decode(data, type=self.ErrorMessage)
        with warnings.catch_warnings():  # this package's deprecated 0.30 helper
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                self.base._handle_output_message(message)
            except Exception as exc:
                return message, exc
        raise AssertionError("0.30 handled an error record without raising")


async def _next_error(router: zmq.asyncio.Socket, request_id: str | None) -> bytes:
    """The next error frame (in its raw bytes) for ``request_id``; other
    frames (heartbeats, outputs) are this tree's own and skipped."""
    while True:
        _, data = await router.recv_multipart()
        raw = msgspec.msgpack.decode(data)
        if raw.get("type") == "error" and raw.get("request_id") == request_id:
            return data


async def test_a_stage_of_this_tree_serves_a_strict_030_orchestrator(
    pipeline_dir: Path,
) -> None:
    tree_030()
    orchestrator = _Strict030()
    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    pipeline = load_pipeline(_pipeline(pipeline_dir, remote=False))
    spec = WorkerSpec(
        stage=pipeline.stage(OLD),
        pipeline=pipeline,
        address=f"tcp://127.0.0.1:{port}",
        orchestrator_pid=os.getpid(),
    )
    lease = processes.acquire()
    stage = await asyncio.to_thread(lease.start_stage, spec, "stage-for-030")
    try:
        async with asyncio.timeout(30):
            identity, data = await router.recv_multipart()
            ready = m.decode(data)
            assert isinstance(ready, m.Ready) and ready.wire == 1  # not welcomed

            async def fail(marker: str, request_id: str) -> tuple[Any, BaseException]:
                submit = m.Submit(request_id=request_id, prompt=f"say {marker}")
                await router.send_multipart([identity, m.encode(submit)])
                return orchestrator.receive(await _next_error(router, request_id))

            message, exc = await fail("@client", "old-client")
            assert (message.fatal, message.stage_id) == (False, OLD)
            assert type(exc) is OmniClientError
            assert (exc.status_code, exc.error_type, exc.message) == (
                404,
                "NotFoundError",
                "no such voice",
            )

            message, exc = await fail("@server", "old-server")
            assert (message.fatal, message.stage_id, message.status_code) == (
                False,
                OLD,
                500,
            )
            # 0.30's fallback for a status that is not a client's.
            assert type(exc) is RuntimeError
            assert str(exc) == GENERIC_SERVER_MESSAGE

            message, exc = await fail("@dead", "old-dead")
            assert (message.fatal, message.stage_id, message.request_id) == (
                True,
                OLD,
                "old-dead",
            )
            assert type(exc) is orchestrator.OmniEngineDeadError
            assert isinstance(exc, EngineDeadError)
            assert exc.error_stage_id == OLD  # type: ignore[attr-defined]
            assert str(exc) == "gpu fell off"  # 0.30 logs the cause
        await asyncio.to_thread(stage.join, 5.0)
        assert not stage.is_alive() and stage.exitcode == 1
    finally:
        stage.kill()
        lease.release()
        router.close(linger=0)
        context.term()
