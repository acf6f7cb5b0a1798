"""The orchestrator's end of the stage wire: one ZMQ ROUTER, its sends and
utility calls (docs/design.md §6)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Any, Literal

import zmq

from vllm_omni.engine.loop_socket import LoopSocket
from vllm_omni.engine.stage_handle import StageHandle
from vllm_omni.wire import messages as m

__all__ = ["StageChannel", "Transport"]

logger = logging.getLogger(__name__)

Transport = Literal["ipc", "tcp"]


class StageChannel:
    """Sends to stages by identity and hands what arrives to ``receive``.

    A stage in this process has no socket: it hears its aborts directly and
    has nothing to shut down or beat for.
    """

    def __init__(
        self,
        transport: Transport,
        host: str,
        port: int,
        receive: Callable[[StageHandle, m.Message], None],
    ) -> None:
        self.transport = transport
        self.host = host
        self.port = port
        self.address = ""
        self.ipc_dir: str | None = None
        self._receive = receive
        self._by_identity: dict[bytes, StageHandle] = {}
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socket: LoopSocket | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)

    def open(self, handles: Iterable[StageHandle]) -> None:
        """Create the ROUTER (bound by ``bind``) for these stages."""
        self._context = zmq.Context()
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        # A ROUTER silently drops what it cannot queue: with MANDATORY an
        # unroutable send fails instead, and without a high-water mark a busy
        # stage's pipe grows (bounded by admission) instead of dropping.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 0)
        router.setsockopt(zmq.RCVHWM, 0)
        self._socket = LoopSocket(router, self._on_frames)
        self._by_identity = {handle.identity: handle for handle in handles}

    def bind(self, loop: asyncio.AbstractEventLoop) -> str:
        """Bind (``ipc://`` under a private temp dir, or ``tcp://``) and start
        reading; the address stages connect to."""
        assert self._socket is not None
        socket = self._socket.socket
        if self.transport == "tcp":
            socket.bind(f"tcp://{self.host}:{self.port or '*'}")
            self.address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.ipc_dir = tempfile.mkdtemp(prefix="vllm-omni-")
            self.address = f"ipc://{self.ipc_dir}/stages.sock"
            socket.bind(self.address)
        self._socket.start(loop)
        return self.address

    def post(
        self, handle: StageHandle, message: m.Message, *, warn: bool = False
    ) -> bool:
        """Send without waiting (no high-water mark: it never blocks); False
        when the stage cannot be reached (not connected, or closed), logged
        as a warning when ``warn``."""
        if handle.inline is not None:
            if isinstance(message, m.Abort):
                handle.inline.abort(message.request_id)
            return True
        if self._socket is None or self._socket.closed:
            return False
        try:
            self._socket.send_multipart([handle.identity, m.encode(message)])
        except zmq.ZMQError as exc:
            logger.log(
                logging.WARNING if warn else logging.DEBUG,
                "send to stage %d failed: %s",
                handle.config.id,
                exc,
            )
            return False
        return True

    def broadcast(self, message: m.Message) -> None:
        """``message`` to every stage (an abort, a shutdown, a heartbeat)."""
        for handle in self._by_identity.values():
            self.post(handle, message)

    def _on_frames(self, frames: list[bytes]) -> None:
        """One message off the wire (``LoopSocket`` calls it as it is read)."""
        if len(frames) != 2:
            return
        handle = self._by_identity.get(frames[0])
        message = m.decode(frames[1])
        if handle is None or message is None:
            logger.debug("dropped a message from %r", frames[0])
            return
        handle.last_seen = handle.now()
        if isinstance(message, m.UtilityResponse):
            future = self._calls.pop(message.call_id, None)
            if future is not None and not future.done():
                future.set_result(message.result)
            return
        self._receive(handle, message)

    # -- utility calls ---------------------------------------------------------

    def ask(
        self, handle: StageHandle, method: str, args: dict[str, Any]
    ) -> tuple[int, asyncio.Future[Any]]:
        """Start one utility call; its id and the future of its result."""
        call_id = next(self._call_ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        self.post(handle, m.UtilityRequest(call_id=call_id, method=method, args=args))
        return call_id, future

    async def call(self, handle: StageHandle, method: str, args: dict[str, Any]) -> Any:
        """One utility call to one stage process; its result (``None`` when
        the engine died meanwhile)."""
        call_id, future = self.ask(handle, method, args)
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def forget(self, call_id: int) -> None:
        self._calls.pop(call_id, None)

    def answer_all(self) -> None:
        """Every call in flight answers ``None`` (the engine died)."""
        for future in self._calls.values():
            if not future.done():
                future.set_result(None)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._context is not None:
            self._context.term()

    def remove_ipc_dir(self) -> None:
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
