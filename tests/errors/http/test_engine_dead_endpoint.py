"""A dead engine's answer over HTTP on every supported vLLM (issue 44): a
real uvicorn server on a loopback port, the official ``openai`` SDK.

Upstream's ``EngineDeadError`` and ``OmniEngineDeadError`` are a fatal 500
``InternalServerError`` with the generic message, never the log text: vLLM
0.33+ names that message ``EngineDeadError.CLIENT_MESSAGE``; before 0.33
(which sent clients ``str(exc)``) the generic sentence stands in
(docs/errors/status-mapping.md, "Older vLLM releases"). ``.ci/vllm-030``
runs this on vLLM 0.30.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest
import uvicorn
from fastapi import FastAPI

from tests.ports import free_port
from vllm_omni.errors import GENERIC_SERVER_MESSAGE
from vllm_omni.errors.http import install_error_handling
from vllm_omni.errors.types import (
    ENGINE_DEAD_MESSAGE,
    EngineDeadError,
    OmniEngineDeadError,
)

REASON = "CUDA error: an illegal memory access at /home/ops/engine.py"


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> None:
        raise EngineDeadError()

    @app.post("/v1/completions")
    async def completions() -> None:
        raise OmniEngineDeadError(stage_id=1, reason=REASON)

    install_error_handling(app)
    return app


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server down"
        time.sleep(0.02)
    try:
        yield openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        )
    finally:
        server.should_exit = True
        thread.join(10)


def _failure(client: openai.OpenAI, route: str) -> openai.InternalServerError:
    with pytest.raises(openai.InternalServerError) as caught:
        if route == "chat":
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        else:
            client.completions.create(model="m", prompt="hi")
    return caught.value


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_dead_engine_is_a_generic_fatal_500(
    client: openai.OpenAI, route: str
) -> None:
    failure = _failure(client, route)
    assert failure.status_code == 500
    assert failure.response.headers["x-should-retry"] == "false"
    error = failure.response.json()["error"]
    assert (error["type"], error["code"], error["message"]) == (
        "InternalServerError",
        500,
        GENERIC_SERVER_MESSAGE,
    )
    body = failure.response.text
    assert ENGINE_DEAD_MESSAGE not in body and "illegal memory" not in body
    assert "/home/ops" not in body
