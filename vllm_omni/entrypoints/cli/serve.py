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
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import uvloop

from vllm_omni.config import PipelineConfig
from vllm_omni.entrypoints.cli.api_servers import (
    engine_kwargs,
    fork_api_servers,
    import_server,
    log_format,
    serve_engine,
)
from vllm_omni.entrypoints.cli.options import (
    add_frontend_options,
    add_omni_options,
    add_tracing_options,
)

__all__ = ["main", "make_parser", "preflight"]

_PROG = "vllm-omni serve"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The exit code of a check that failed before startup (argparse's too).
_USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """An argument error is one line (``prog: error: ...``), no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(_USAGE_ERROR, f"{self.prog}: error: {message}\n")


class PreflightError(Exception):
    """A check before startup failed; the message is the one line to print."""


def make_parser() -> argparse.ArgumentParser:
    """The light parser: this project's options and ``--host``/``--port``/
    ``--api-key``, checked before vLLM is imported; anything else (a model,
    vLLM's serve arguments, ``--help``) is left for vLLM's own parser."""
    parser = _Parser(
        prog=_PROG,
        description="Serve a multi-stage pipeline over an OpenAI-compatible API.",
        add_help=False,
        allow_abbrev=False,
    )
    add_frontend_options(parser)
    add_omni_options(parser)
    add_tracing_options(parser)
    return parser


def preflight(args: argparse.Namespace) -> None:
    """Check the pipeline file, claim the job store and bind the port, all
    before vLLM is imported; raise ``PreflightError`` with one line."""
    from vllm_omni.entrypoints.openai import job_lock

    if not isinstance(args.pipeline, PipelineConfig):
        preflight_pipeline(args.pipeline)
    if args.job_store:
        try:
            job_lock.claim(args.job_store, ahead=True)
        except (job_lock.JobStoreInUseError, OSError) as exc:
            raise PreflightError(_one_line(exc)) from None
    count = getattr(args, "api_server_count", None) or 1
    args.listen_sockets = _bind(args.host, args.port, count)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _bind(host: str, port: int, count: int = 1) -> list[socket.socket]:
    """The listening address, bound now (uvicorn listens on it later), so a
    port in use fails before startup and nobody can take it meanwhile.

    ``count`` > 1 (``--api-server-count``): one socket per API server
    process, each with ``SO_REUSEPORT``, so that the kernel spreads new
    connections over the processes evenly instead of handing them to
    whichever process is awake when they arrive (one shared socket). The
    port is first bound without it: a port that anything holds, one of
    these servers included, is refused as with one process."""
    if not 1 <= port <= 65535:
        raise PreflightError(f"--port must be between 1 and 65535, not {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PreflightError(f"cannot resolve --host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sockets: list[socket.socket] = []
    try:
        plain = _bound(family, kind, proto, address, reuse_port=False)
        if count == 1 or not hasattr(socket, "SO_REUSEPORT"):
            return [plain]
        plain.close()
        for _ in range(count):
            sockets.append(_bound(family, kind, proto, address, reuse_port=True))
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise PreflightError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    return sockets


def _bound(
    family: int, kind: int, proto: int, address: tuple[Any, ...], *, reuse_port: bool
) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


async def _serve(args: argparse.Namespace) -> int:
    """Start the stages while this process imports vLLM's serving modules
    (which the stages do not need), then serve."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    starting = asyncio.create_task(AsyncOmni.create(**engine_kwargs(args)))
    try:
        api_server = await asyncio.to_thread(import_server)
    except BaseException:
        starting.cancel()
        with contextlib.suppress(BaseException):
            (await starting).shutdown()
        raise
    return int(await api_server.run_server(args, engine=await starting))


def _parse(argv: list[str]) -> argparse.Namespace:
    """This project's own options first (a mistake in them fails before vLLM
    is imported, in milliseconds); a model, any other argument or ``--help``
    then goes through vLLM's own serve parser, which exits with one line on
    an argument it does not know."""
    args, rest = make_parser().parse_known_args(argv)
    if not rest:
        args.pipeline = args.pipeline or "reference"
        args.uvicorn_log_level = args.log_level
        return args
    from vllm_omni.entrypoints.cli import vllm_args

    if args.pipeline is not None:
        # A broken pipeline file fails before vLLM's argument modules load.
        preflight_pipeline(args.pipeline)
    parser = vllm_args.make_parser(_PROG)
    own = {action.dest for action in make_parser()._actions}
    try:
        served = vllm_args.resolve(parser, argv, own)
    except vllm_args.CommandLineError as exc:
        raise PreflightError(str(exc)) from None
    full = served.args
    full.pipeline = served.pipeline
    if full.uvicorn_log_level == parser.get_default("uvicorn_log_level"):
        full.uvicorn_log_level = full.log_level
    return full


def preflight_pipeline(spec: str) -> None:
    """A pipeline file that cannot be loaded, as one line (no vLLM import)."""
    from vllm_omni.config import PipelineConfigError, check_pipeline

    try:
        # Fault exception classes need vLLM; AsyncOmni checks them at load.
        check_pipeline(spec, build_faults=False)
    except PipelineConfigError as exc:
        raise PreflightError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parse(list(sys.argv[1:] if argv is None else argv))
        preflight(args)
    except PreflightError as exc:
        sys.stderr.write(f"{_PROG}: error: {exc}\n")
        return _USAGE_ERROR
    count = getattr(args, "api_server_count", None) or 1
    logging.basicConfig(
        level=args.log_level.upper(),
        format=log_format("engine") if count > 1 else _LOG_FORMAT,
    )
    from vllm_omni.errors.logs import install_log_redaction

    # Before anything logs: this process and the stages forked from it.
    install_log_redaction()
    from vllm_omni.engine.processes import start_launcher
    from vllm_omni.engine.stage_handle import StageStartupError
    from vllm_omni.errors import VLLMValidationError
    from vllm_omni.tracing.provider import flush as flush_traces

    # With several API server processes they are forked first, while no
    # thread runs, and share the bound port (``api_servers``).
    servers = fork_api_servers(args, count) if count > 1 else None
    # The stage worker (and with it vLLM) is imported and no thread runs yet:
    # the stage launcher is a fork of this process and imports nothing.
    start_launcher(fork=True)
    code = 0
    try:
        # The loop ``vllm serve`` runs on.
        if servers is None:
            code = uvloop.run(_serve(args))
        else:
            code = uvloop.run(serve_engine(args, servers))
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
    # interpreter teardown of torch/vLLM so a dead engine frees the port fast
    # (after the last spans left: os._exit skips atexit).
    flush_traces()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
