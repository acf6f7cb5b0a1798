"""``vllm-omni serve``: start the OpenAI-compatible server on a pipeline.

Order matters: everything an operator can get wrong (the command line, the
pipeline file, the job store held by another server, the port) is checked
before vLLM is imported, so each fails in well under a second with one line
on stderr and a non-zero exit, never a traceback after half a minute. Then
the stage worker is imported (vLLM and torch, once) and the stage launcher
is forked from this still single-threaded process (see
``vllm_omni.engine.processes``), so nothing imports vLLM a second time; the
stages start while this process goes on importing vLLM's serving modules
(which only the server needs) for the HTTP side, in a thread: the engine's
loop must keep running meanwhile (heartbeats to stages on other hosts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from vllm_omni.entrypoints.openai.limits import add_limit_options

__all__ = ["main", "make_parser", "preflight"]

_PROG = "vllm-omni serve"
_API_SERVER = "vllm_omni.entrypoints.openai.api_server"
# The exit code of a check that failed before startup (argparse's too).
_USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """An argument error is one line (``prog: error: ...``), no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(_USAGE_ERROR, f"{self.prog}: error: {message}\n")


class PreflightError(Exception):
    """A check before startup failed; the message is the one line to print."""


def _default_job_store() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache) / "vllm-omni" / "jobs.sqlite3")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a positive number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=_PROG,
        description="Serve a multi-stage pipeline over an OpenAI-compatible API.",
    )
    parser.add_argument(
        "--pipeline",
        default="reference",
        help="'reference' (built in, CPU, no weights) or a pipeline YAML file",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_OMNI_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $VLLM_OMNI_API_KEY)",
    )
    parser.add_argument(
        "--error-mode",
        choices=("strict", "legacy"),
        default="strict",
        help="legacy: raw ValueError/TypeError/OverflowError → 400 and "
        "NotImplementedError → 501 while call sites migrate (counted, logged)",
    )
    parser.add_argument(
        "--max-num-queued-reqs",
        type=_positive_int,
        default=None,
        help="requests in flight before new ones are refused with 503 "
        "QueueOverflowError and a Retry-After header (admission control; "
        "default: the engine's, 1024)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=_positive_float,
        default=None,
        help="seconds every stage gets to be ready before the start fails "
        "with the name of the stage that was not (default 120; a vllm stage "
        "loads its model in that time)",
    )
    parser.add_argument(
        "--job-store",
        default=_default_job_store(),
        help="SQLite file for async video jobs (survives restarts)",
    )
    parser.add_argument(
        "--worker-backend",
        choices=("multi_process", "ray"),
        default=None,
        help="run stages as local processes (default) or as Ray actors "
        "(pip install 'vllm-omni[ray]'); overrides the pipeline's worker_backend",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="with --worker-backend ray: join this cluster (HOST:PORT); "
        "default: start a local Ray instance on 127.0.0.1 with the server",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
    )
    add_limit_options(parser)
    return parser


def preflight(args: argparse.Namespace) -> None:
    """Check the pipeline file, claim the job store and bind the port, all
    before vLLM is imported; raise ``PreflightError`` with one line."""
    from vllm_omni.config import PipelineConfigError, check_pipeline
    from vllm_omni.entrypoints.openai import job_lock

    try:
        # Fault exception classes need vLLM; AsyncOmni checks them at load.
        check_pipeline(args.pipeline, build_faults=False)
    except PipelineConfigError as exc:
        raise PreflightError(str(exc)) from None
    if args.job_store:
        try:
            job_lock.claim(args.job_store, ahead=True)
        except (job_lock.JobStoreInUseError, OSError) as exc:
            raise PreflightError(_one_line(exc)) from None
    args.listen_socket = _bind(args.host, args.port)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, bound now (uvicorn listens on it later), so a
    port in use fails before startup and nobody can take it meanwhile."""
    if not 1 <= port <= 65535:
        raise PreflightError(f"--port must be between 1 and 65535, not {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PreflightError(f"cannot resolve --host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise PreflightError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    sock.set_inheritable(False)
    return sock


async def _serve(args: argparse.Namespace) -> int:
    """Start the stages while this process imports vLLM's serving modules
    (which the stages do not need), then serve."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    limits: dict[str, float] = {}
    if args.max_num_queued_reqs is not None:
        limits["max_num_queued_reqs"] = args.max_num_queued_reqs
    if args.startup_timeout is not None:
        limits["startup_timeout_s"] = args.startup_timeout
    starting = asyncio.create_task(
        AsyncOmni.create(
            pipeline=args.pipeline,
            worker_backend=args.worker_backend,
            ray_address=args.ray_address,
            **limits,
        )
    )
    try:
        api_server = await asyncio.to_thread(_import_server)
    except BaseException:
        starting.cancel()
        with contextlib.suppress(BaseException):
            (await starting).shutdown()
        raise
    return int(await api_server.run_server(args, engine=await starting))


def _import_server() -> ModuleType:
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


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    args.uvicorn_log_level = args.log_level
    try:
        preflight(args)
    except PreflightError as exc:
        sys.stderr.write(f"{_PROG}: error: {exc}\n")
        return _USAGE_ERROR
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from vllm_omni.errors.logs import install_log_redaction

    # Before anything logs: this process and the stages forked from it.
    install_log_redaction()
    from vllm_omni.engine.orchestrator import StageStartupError
    from vllm_omni.engine.processes import start_launcher
    from vllm_omni.errors import VLLMValidationError

    # The stage worker (and with it vLLM) is imported and no thread runs yet:
    # the stage launcher is a fork of this process and imports nothing.
    start_launcher(fork=True)
    code = 0
    try:
        code = asyncio.run(_serve(args))
    except KeyboardInterrupt:
        code = 0
    except (VLLMValidationError, StageStartupError) as exc:
        # A pipeline or stage that cannot start: one line, no traceback
        # (the message itself, without upstream's "(parameter=...)" suffix).
        message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else exc
        sys.stderr.write(f"{_PROG}: error: {_one_line(Exception(message))}\n")
        code = 1
    except Exception:
        logging.getLogger("vllm_omni.server").exception("server failed")
        code = 1
    # The server and the stages are already shut down; skip the slow
    # interpreter teardown of torch/vLLM so a dead engine frees the port fast.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
