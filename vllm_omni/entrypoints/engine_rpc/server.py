"""The engine process's side: ``AsyncOmni`` and the job store, served to the
API server processes (``protocol`` has the messages).

Each ``generate`` runs as a task of its own, as a route's would with one
process: it carries the abort context the API server's ``close`` fills in,
so an abort is counted once, with the transport's reason. It must not
classify or render errors: what ``AsyncOmni`` raises crosses as it is (it
survives ``pickle``), and the API server's boundary renders it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

import zmq

from vllm_omni.engine.loop_socket import LoopSocket
from vllm_omni.engine.stage_metrics import STAGE_METRICS
from vllm_omni.entrypoints.engine_rpc.protocol import (
    CALLS,
    EngineInfo,
    dumps,
    loads,
    open_socket,
)
from vllm_omni.errors import OmniServiceUnavailableError, for_caller
from vllm_omni.errors.metrics import (
    AbortContext,
    AbortReason,
    record_abort_of,
    set_abort_context,
)

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.entrypoints.openai.jobs import VideoJobs

__all__ = ["EngineServer"]

logger = logging.getLogger("vllm_omni.engine_rpc")

# How often the server looks for the engine's death when no request does.
_DEATH_POLL_S = 0.1
_MODALITIES = ("text", "audio", "image", "video")


class _Stream:
    """One API server request's ``generate``, running here."""

    __slots__ = ("context", "started", "task")

    def __init__(self) -> None:
        self.context = AbortContext()
        self.task: asyncio.Task[None] | None = None
        # Whether its task ran: the engine's generate counts an abort from
        # then on.
        self.started = False


class EngineServer:
    """Serves ``engine`` (and ``jobs``) on ``address`` to API server processes."""

    def __init__(self, engine: AsyncOmni, jobs: VideoJobs | None, address: str) -> None:
        self.engine = engine
        self.jobs = jobs
        self.address = address
        self._context = zmq.Context()
        self._socket = LoopSocket(
            open_socket(self._context, zmq.ROUTER), self._on_frames
        )
        self._clients: set[bytes] = set()
        self._streams: dict[tuple[bytes, int], _Stream] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Bind and serve from the running loop."""
        self._socket.socket.bind(self.address)
        self._socket.start(asyncio.get_running_loop())
        self._watch = asyncio.create_task(self._watch_death(), name="engine-death")

    def info(self) -> EngineInfo:
        engine = self.engine
        return EngineInfo(
            config=engine.config,
            modalities=engine.modalities,
            stages_for={m: engine.stage_for(m) for m in _MODALITIES},
            voices=engine.voices,
            max_num_queued_reqs=engine.max_num_queued_reqs,
            retention_s=None if self.jobs is None else self.jobs.retention_s,
            pid=os.getpid(),
        )

    async def close(self) -> None:
        """Stop serving: every stream still here is closed (its request
        aborted in every stage), then the socket."""
        if self._watch is not None:
            self._watch.cancel()
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        tasks += list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._socket.close()
        self._context.term()

    # -- the wire --------------------------------------------------------------

    def _send(self, client: bytes, message: tuple[Any, ...]) -> None:
        try:
            data = dumps(message)
        except Exception as exc:  # an output or result that does not pickle
            logger.exception("a %s message does not pickle", message[0])
            if message[0] not in ("output", "result"):
                return
            error = for_caller(
                OmniServiceUnavailableError("The engine's answer could not be sent.")
            )
            error.__cause__ = exc
            data = dumps(
                ("error", message[1], error)
                if message[0] == "output"
                else ("result", message[1], False, error)
            )
        with contextlib.suppress(zmq.ZMQError):  # that API server is gone
            self._socket.send_multipart([client, data])

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            return
        client, message = frames[0], loads(frames[1])
        kind = message[0]
        if kind == "generate":
            self._generate(client, message[1], message[2], message[3])
        elif kind == "close":
            self._close(client, message[1], message[2])
        elif kind == "abort":
            self._spawn(self.engine.abort(message[1], reason=message[2]))
        elif kind == "call":
            self._spawn(self._call(client, *message[1:]))
        elif kind == "hello":
            self._clients.add(client)
            self._send(client, ("hello", self.info()))
            if self.engine.errored:
                self._send(client, ("dead", for_caller(self.engine.dead_error)))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- requests --------------------------------------------------------------

    def _generate(
        self, client: bytes, key: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        stream = _Stream()
        self._streams[(client, key)] = stream
        stream.task = asyncio.create_task(self._run(client, key, stream, args, kwargs))

    async def _run(
        self,
        client: bytes,
        key: int,
        stream: _Stream,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        stream.started = True
        set_abort_context(stream.context)
        try:
            outputs = self.engine.generate(*args, **kwargs)
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    self._send(client, ("output", key, output))
            self._send(client, ("end", key))
        except asyncio.CancelledError:
            pass  # closed by the API server: nobody reads the rest
        except Exception as exc:
            # AsyncOmni raises for its caller already: a VLLMError that pickles.
            self._send(client, ("error", key, exc))
        finally:
            self._streams.pop((client, key), None)

    def _close(self, client: bytes, key: int, reason: AbortReason | None) -> None:
        stream = self._streams.get((client, key))
        if stream is None or stream.task is None:
            return
        stream.context.reason = reason
        if not stream.started:
            # Closed before its task ran (the generate and the close came in
            # one read, the client gone as the route sent it): the engine
            # never sees the request and the API server left the count to
            # it, so it is counted here, once; its task's own cleanup never
            # runs either.
            record_abort_of(stream.context, "cancelled")
            del self._streams[(client, key)]
        stream.task.cancel()

    async def _call(
        self, client: bytes, call_id: int, target: str, method: str, args: Any
    ) -> None:
        try:
            if method not in CALLS.get(target, ()):
                raise OmniServiceUnavailableError(f"No engine call {target}.{method}.")
            value = await self._invoke(target, method, args)
        except Exception as exc:
            self._send(client, ("result", call_id, False, for_caller(exc)))
        else:
            self._send(client, ("result", call_id, True, value))

    async def _invoke(self, target: str, method: str, kwargs: dict[str, Any]) -> Any:
        if target == "metrics":
            return list(STAGE_METRICS.collect())
        if target == "jobs":
            if self.jobs is None:
                raise OmniServiceUnavailableError("The video job store is not running.")
            owner: Any = self.jobs
        else:
            owner = self.engine
        result = getattr(owner, method)(**kwargs)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    async def _watch_death(self) -> None:
        """Tell every API server once the engine is dead (its requests in
        flight hear it on their own streams)."""
        while not self.engine.errored:
            await asyncio.sleep(_DEATH_POLL_S)
        error = for_caller(self.engine.dead_error)
        for client in self._clients:
            self._send(client, ("dead", error))
