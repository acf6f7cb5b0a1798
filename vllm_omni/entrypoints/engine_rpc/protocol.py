"""What the engine process and its API server processes say to each other.

Pickled tuples over one ZMQ ROUTER (engine) / DEALER (each API server)
pair on an ``ipc://`` socket in a directory only this server's user can
enter: both ends are this server's own processes, forked from one parent.
The first element names the message:

API server → engine:
    ``("hello",)``: the engine answers ``("hello", EngineInfo)``.
    ``("generate", key, args, kwargs)``: ``AsyncOmni.generate(*args,
    **kwargs)``; the engine answers ``("output", key, output)`` per output,
    then ``("end", key)`` or ``("error", key, exception)``.
    ``("close", key, reason)``: the API server stopped reading ``key``'s
    stream (its client left, a deadline): the engine closes the request's
    stream as ``AsyncOmni``'s caller would, counting the abort with ``reason``.
    ``("abort", request_ids, reason)``: ``AsyncOmni.abort``.
    ``("call", call_id, target, method, args)``: one of ``CALLS``; the
    engine answers ``("result", call_id, ok, value_or_exception)``.

Engine → every API server:
    ``("dead", error)``: the engine died; ``error`` is its dead error.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import TYPE_CHECKING, Any

import zmq

if TYPE_CHECKING:
    from vllm_omni.config import PipelineConfig, StageConfig

__all__ = ["CALLS", "EngineInfo", "dumps", "loads", "open_socket"]

# What an API server may call in the engine process, by target.
CALLS: dict[str, frozenset[str]] = {
    "engine": frozenset(
        {
            "check_health",
            "check_faulted",
            "fault_tolerance_status",
            "apply_fault_instruction",
            "stage_stats",
            "stage_pids",
        }
    ),
    "jobs": frozenset({"submit", "get", "list", "content", "cancel", "delete"}),
    "metrics": frozenset({"stage_families"}),
}


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What an API server process needs to know of the engine, once."""

    config: PipelineConfig
    modalities: frozenset[str]
    stages_for: dict[str, StageConfig | None]
    voices: list[str]
    max_num_queued_reqs: int
    retention_s: int | None
    pid: int


def dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> tuple[Any, ...]:
    message: tuple[Any, ...] = pickle.loads(data)
    return message


def open_socket(
    context: zmq.Context[zmq.Socket[bytes]], kind: int
) -> zmq.Socket[bytes]:
    """One end of the wire: nothing lingers at close, and nothing is dropped
    or blocks on a high-water mark (admission bounds what is in flight)."""
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    return socket
