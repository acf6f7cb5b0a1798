"""``--api-server-count N``: N API server processes on one port, one engine.

As ``vllm serve --api-server-count N`` does, ``vllm-omni serve`` then runs
N API server processes in front of one pipeline (docs/serving.md, "Several
API server processes"). This process is the engine process: it binds the
port (``serve.preflight``: one socket per process, so that the kernel
spreads connections over them), forks the API server processes while it is
still single-threaded (they inherit their listening sockets, the admission
board and the metrics directory), then starts the pipeline and the video
job store and serves them over ``engine_rpc``. Each API server process
imports the serving modules, waits for the engine and serves HTTP.

One process ends, the server ends, as ``vllm serve`` does: an API server
process that exits or is killed stops the others and the engine, and the
engine process exits non-zero; nothing is restarted. SIGINT or SIGTERM to
the engine process stops the API server processes gracefully (they finish
what they serve, as with one process), then the engine. An API server
process dies with the engine process (``PR_SET_PDEATHSIG``), so a killed
engine process leaves none behind, and the stage launcher ends with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import importlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from types import ModuleType
from typing import Any

import uvloop

from vllm_omni.entrypoints.engine_rpc.board import AdmissionBoard

__all__ = [
    "ApiServers",
    "engine_kwargs",
    "fork_api_servers",
    "import_server",
    "log_format",
    "serve_engine",
]

logger = logging.getLogger("vllm_omni.server")

_API_SERVER = "vllm_omni.entrypoints.openai.api_server"
_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
_PR_SET_PDEATHSIG = 1
# How long API server processes get to finish what they serve (uvicorn's
# graceful shutdown is 5 s) before they are killed.
_STOP_GRACE_S = 10.0
_POLL_S = 0.1
# An API server waits this much longer than the stages may take to start.
_CONNECT_MARGIN_S = 60.0
_DEFAULT_STARTUP_S = 120.0


def import_server() -> ModuleType:
    """The API server module and its route modules, imported (in a thread).

    Nothing of it may be imported on the engine's loop once the engine runs:
    the route modules import vLLM's serving code, seconds of work that holds
    the GIL, and meanwhile the loop sends no heartbeat to stages on other
    hosts (measured: 10 to 60 s, past a remote stage's orchestrator timeout
    on a loaded host) and reads none of their messages.
    """
    module = importlib.import_module(_API_SERVER)
    module.route_modules()
    return module


def log_format(process: str) -> str:
    """The log line of one of the server's processes, naming it."""
    return f"%(asctime)s %(levelname)s {process} %(name)s: %(message)s"


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``AsyncOmni``'s arguments from the command line."""
    kwargs: dict[str, Any] = {
        "pipeline": args.pipeline,
        "worker_backend": args.worker_backend,
        "ray_address": args.ray_address,
        "otlp_traces_endpoint": args.otlp_traces_endpoint,
    }
    if args.max_num_queued_reqs is not None:
        kwargs["max_num_queued_reqs"] = args.max_num_queued_reqs
    if args.startup_timeout is not None:
        kwargs["startup_timeout_s"] = args.startup_timeout
    return kwargs


@dataclasses.dataclass
class ApiServers:
    """The API server processes this engine process forked, and what they share."""

    count: int
    run_dir: str
    board: AdmissionBoard
    pids: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"ipc://{self.run_dir}/engine.sock"

    def remove(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


def keep_metrics_in_files(run_dir: str) -> None:
    """Every metric this process and its forks create from now on goes to
    the multiprocess files that ``/metrics`` sums (before any exists)."""
    from prometheus_client import values

    directory = os.path.join(run_dir, "metrics")
    os.makedirs(directory, exist_ok=True)
    os.environ[_MULTIPROC_DIR] = directory
    values.ValueClass = values.get_value_class()


def fork_api_servers(args: argparse.Namespace, count: int) -> ApiServers:
    """Fork ``count`` API server processes; in each, serve and exit."""
    servers = ApiServers(
        count=count,
        run_dir=tempfile.mkdtemp(prefix="vllm-omni-api-"),
        board=AdmissionBoard(count),
    )
    keep_metrics_in_files(servers.run_dir)
    parent = os.getpid()
    for index in range(count):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _keep_own_socket(args, index)
                code = _api_server_process(args, servers, index, parent)
            except BaseException:
                logger.exception("API server %d failed", index)
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        servers.pids[pid] = index
    # The API server processes listen; this one holds no socket of theirs
    # (a process that dies takes its own with it).
    for sock in getattr(args, "listen_sockets", ()):
        sock.close()
    args.listen_sockets = []
    return servers


def _keep_own_socket(args: argparse.Namespace, index: int) -> None:
    """In API server process ``index``: its own listening socket (one per
    process, ``serve._bind``), or the one they all share; the others closed."""
    sockets = list(getattr(args, "listen_sockets", ()))
    if not sockets:
        return
    own = sockets[index] if len(sockets) > 1 else sockets[0]
    for sock in sockets:
        if sock is not own:
            sock.close()
    args.listen_sockets = [own]


def _api_server_process(
    args: argparse.Namespace, servers: ApiServers, index: int, parent: int
) -> int:
    """One API server process, from its fork to its exit code."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return 1  # the engine process is gone already
    # Ctrl-C reaches the whole process group; the engine process decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _name_the_process(f"api-server-{index}")
    return int(uvloop.run(_serve_api(args, servers, index)))


def _name_the_process(name: str) -> None:
    formatter = logging.Formatter(log_format(name))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)


async def _serve_api(args: argparse.Namespace, servers: ApiServers, index: int) -> int:
    from vllm_omni.entrypoints.engine_rpc.client import EngineClient

    client = EngineClient(servers.address, servers.board, index)
    api_server = await asyncio.to_thread(import_server)
    startup = args.startup_timeout or _DEFAULT_STARTUP_S
    await client.connect(startup + _CONNECT_MARGIN_S)
    code = await api_server.run_server(
        args, engine=client, exit_signals=(signal.SIGTERM,)
    )
    return int(code)


# -- the engine process ------------------------------------------------------------


async def serve_engine(args: argparse.Namespace, servers: ApiServers) -> int:
    """Start the pipeline and serve it to the API server processes until one
    of them exits or a signal stops the server; stop them, then the engine.

    Returns the exit code: 0 after a signal, 1 when an API server process
    ended by itself (it failed, was killed, or saw the engine die)."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.entrypoints.engine_rpc.server import EngineServer
    from vllm_omni.entrypoints.openai.jobs import VideoJobs

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    engine: AsyncOmni | None = None
    jobs: VideoJobs | None = None
    server: EngineServer | None = None
    exited: tuple[int, int] | None = None
    try:
        engine = await AsyncOmni.create(**engine_kwargs(args))
        engine.watch_in_flight(servers.board.set)
        jobs = await VideoJobs.start(
            args.job_store,
            engine,
            mode=args.error_mode,
            retention_s=args.job_retention,
        )
        server = EngineServer(engine, jobs, servers.address)
        server.start()
        logger.info(
            "engine serving %s to %d API server processes (pids %s)",
            engine.model_name,
            servers.count,
            ", ".join(map(str, servers.pids)),
        )
        exited = await _first_exit(servers, stop)
    finally:
        if exited is not None:
            pid, status = exited
            logger.error(
                "API server %d (pid %d) %s: stopping the server",
                servers.pids.pop(pid),
                pid,
                _describe(status),
            )
        await asyncio.to_thread(_stop_api_servers, servers)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if jobs is not None:
            await jobs.shutdown()
        if server is not None:
            await server.close()
        if engine is not None:
            engine.shutdown()
        servers.remove()
    return 1 if exited is not None or (engine and engine.errored) else 0


async def _first_exit(
    servers: ApiServers, stop: asyncio.Event
) -> tuple[int, int] | None:
    """The first API server process to end (pid, wait status), or ``None``
    once ``stop`` is set."""
    while not stop.is_set():
        for pid in list(servers.pids):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return pid, status
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _POLL_S)
    return None


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _stop_api_servers(servers: ApiServers) -> None:
    """SIGTERM every API server process still running, wait for them to
    finish what they serve, kill what remains; reap them all."""
    for pid in servers.pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while servers.pids and time.monotonic() < deadline:
        for pid in list(servers.pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                servers.pids.pop(pid)
        time.sleep(_POLL_S / 2)
    for pid in list(servers.pids):
        logger.warning(
            "API server %d (pid %d) did not stop: killing it", servers.pids[pid], pid
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        servers.pids.pop(pid)
