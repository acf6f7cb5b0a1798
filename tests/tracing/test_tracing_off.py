"""Tracing off costs nothing (issue 39): a server that served a request, with
a client's ``traceparent``, has imported nothing of OpenTelemetry's SDK (nor
its API). In a process of its own, the app as ``vllm-omni serve`` builds it,
the reference pipeline's stages in their processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, sys
import httpx
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.cli.serve import make_parser
from vllm_omni.entrypoints.openai import api_server

args = make_parser().parse_args(["--job-store", sys.argv[1]])
args.pipeline = "reference"
args.uvicorn_log_level = "info"


async def main() -> None:
    engine = await AsyncOmni.create("reference")
    try:
        app = api_server.build_app(args)
        await api_server.init_app_state(app, engine, args)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            answer = await c.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hello"}]},
                headers={
                    "traceparent": "00-0af7651916cd43dd8448eb211c80319c"
                    "-b7ad6b7169203331-01"
                },
            )
            assert answer.status_code == 200, answer.text
    finally:
        engine.shutdown()
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))


asyncio.run(main())
"""


def test_serving_with_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("OTEL_")
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path / "jobs.db")],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
