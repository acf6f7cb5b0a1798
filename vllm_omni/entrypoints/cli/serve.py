"""``vllm-omni serve``: start the OpenAI-compatible server on a pipeline."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "make_parser"]


def _default_job_store() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache) / "vllm-omni" / "jobs.sqlite3")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-omni serve",
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
        "--job-store",
        default=_default_job_store(),
        help="SQLite file for async video jobs (survives restarts)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    args.uvicorn_log_level = args.log_level
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from vllm_omni.entrypoints.openai.api_server import run_server

    code = 0
    try:
        code = asyncio.run(run_server(args))
    except KeyboardInterrupt:
        code = 0
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
