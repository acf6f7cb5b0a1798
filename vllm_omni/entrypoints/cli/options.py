"""The options of ``vllm-omni serve`` that are this project's own.

They are added both to the light parser that checks them before vLLM is
imported and to vLLM's own serve parser (``vllm_args``); this module must
not import vLLM.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vllm_omni.entrypoints.openai.limits import add_limit_options

__all__ = [
    "OWN_FRONTEND",
    "add_frontend_options",
    "add_omni_options",
    "add_tracing_options",
]

# Frontend options vLLM's serve parser has too; the light parser needs them to
# check them (and bind the port) before vLLM is imported.
OWN_FRONTEND = ("host", "port", "api_key")
DEFAULT_HOST = "127.0.0.1"


def default_api_key() -> str | None:
    return os.environ.get("VLLM_OMNI_API_KEY")


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


def add_frontend_options(parser: argparse.ArgumentParser) -> None:
    """``--host``, ``--port``, ``--api-key`` and ``--api-server-count`` as the
    light parser knows them."""
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=default_api_key(),
        help="require 'Authorization: Bearer KEY' (default: $VLLM_OMNI_API_KEY)",
    )
    parser.add_argument(
        "--api-server-count",
        "-asc",
        type=_positive_int,
        default=None,
        help="API server processes on the port, in front of one pipeline (default 1)",
    )


def add_tracing_options(parser: argparse.ArgumentParser) -> None:
    """``--otlp-traces-endpoint`` as the light parser knows it: vLLM's flag,
    with vLLM's meaning (its own parser defines it for a model's command
    line; it is never refused there)."""
    parser.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        help="export OpenTelemetry traces over OTLP to this URL: the server, "
        "every stage and every vllm stage's engine (protocol: "
        "$OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, grpc by default; default: the "
        "OTEL_EXPORTER_OTLP_* environment, else no tracing)",
    )


def add_omni_options(parser: argparse.ArgumentParser) -> None:
    """Every option of this project's own (not ``--host``/``--port``/``--api-key``)."""
    group = parser.add_argument_group(
        "vllm-omni",
        "vllm-omni's own options: the pipeline, error mode, admission, "
        "video jobs, worker backend.",
    )
    group.add_argument(
        "--pipeline",
        default=None,
        help="'reference' (built in, CPU, no weights) or a pipeline YAML file; "
        "default: one vllm stage serving MODEL when one is given, else 'reference'",
    )
    group.add_argument(
        "--error-mode",
        choices=("strict", "legacy"),
        default="strict",
        help="legacy: raw ValueError/TypeError/OverflowError → 400 and "
        "NotImplementedError → 501 while call sites migrate (counted, logged)",
    )
    group.add_argument(
        "--max-num-queued-reqs",
        type=_positive_int,
        default=None,
        help="requests in flight before new ones are refused with 503 "
        "QueueOverflowError and a Retry-After header (admission control; "
        "default: the engine's, 1024)",
    )
    group.add_argument(
        "--startup-timeout",
        type=_positive_float,
        default=None,
        help="seconds every stage gets to be ready before the start fails "
        "with the name of the stage that was not (default 120; a vllm stage "
        "loads its model in that time)",
    )
    group.add_argument(
        "--job-store",
        default=_default_job_store(),
        help="SQLite file for async video jobs (survives restarts)",
    )
    group.add_argument(
        "--job-retention",
        type=_positive_int,
        default=None,
        metavar="SECONDS",
        help="keep a finished video job (its record and GIF) this long after "
        "it finished, then delete it (its expires_at says when; default: "
        "until a client deletes it)",
    )
    group.add_argument(
        "--worker-backend",
        choices=("multi_process", "ray"),
        default=None,
        help="run stages as local processes (default) or as Ray actors "
        "(pip install 'vllm-omni[ray]'); overrides the pipeline's worker_backend",
    )
    group.add_argument(
        "--ray-address",
        default=None,
        help="with --worker-backend ray: join this cluster (HOST:PORT); "
        "default: start a local Ray instance on 127.0.0.1 with the server",
    )
    group.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="this server's log level (and uvicorn's, unless "
        "--uvicorn-log-level is given)",
    )
    add_limit_options(parser)
