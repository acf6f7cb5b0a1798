"""A test app with one route per row of the status table, for the HTTP boundary.

Used in-process by ``test_http_boundary.py`` and as a real uvicorn process
(``python -m tests.e2e.boundary_app --port N``) for the engine-death tests,
which need a server that can actually exit.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI
from prometheus_fastapi_instrumentator import Instrumentator
from pydantic import BaseModel, Field
from vllm.exceptions import (
    ChatTemplateResolutionError,
    GenerationError,
    LoRAAdapterNotFoundError,
    ProfilerAlreadyActiveError,
    QueueOverflowError,
    RetryableRequestError,
)

from vllm_omni.errors import (
    EngineGenerateError,
    GuardrailViolationError,
    OmniClientError,
    OmniConflictError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniNotImplementedError,
    OmniServerError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm_omni.errors.http import install_error_handling


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


# name -> exception factory. Expected renderings live in the test, not here.
RAISERS: dict[str, Callable[[], BaseException]] = {
    "validation": lambda: VLLMValidationError(
        "temperature must be at most 2", parameter="temperature", value="sk-live-123"
    ),
    "not_found": lambda: VLLMNotFoundError("The model `nope` does not exist."),
    "lora_not_found": lambda: LoRAAdapterNotFoundError("a", "/home/alice/loras/a"),
    "unprocessable": lambda: VLLMUnprocessableEntityError(
        "image could not be decoded", parameter="image"
    ),
    "chat_template": lambda: ChatTemplateResolutionError("no chat template"),
    "client": lambda: VLLMClientError("bad request"),
    "guardrail": lambda: GuardrailViolationError("prompt blocked by guardrail"),
    "conflict": lambda: OmniConflictError("job is still running"),
    "omni_client_404": lambda: OmniClientError(
        "voice not found", status_code=404, error_type="NotFoundError"
    ),
    "generation": lambda: GenerationError("KV cache load failed"),
    "retryable": lambda: RetryableRequestError(),
    "queue_overflow": lambda: QueueOverflowError(),
    "profiler_active": lambda: ProfilerAlreadyActiveError(),
    "engine_generate": lambda: EngineGenerateError("request failed in engine"),
    "omni_engine_generate": lambda: OmniEngineGenerateError("stage failed", stage_id=1),
    "server": lambda: VLLMServerError("server-side failure"),
    "not_implemented": lambda: OmniNotImplementedError("remix is not implemented"),
    "unavailable": lambda: OmniServiceUnavailableError("pipeline has no audio stage"),
    "stage_timeout": lambda: OmniStageTimeoutError("stage 2 deadline", stage_id=2),
    "omni_server_502": lambda: OmniServerError(
        "upstream stage host failed", status_code=502, error_type="BadGatewayError"
    ),
    "vllm_error": lambda: VLLMError("bare vllm error"),
    "key_error": lambda: KeyError("/home/alice/secret"),
    "value_error": lambda: ValueError("internal parse failure"),
    "type_error": lambda: TypeError("internal type mix-up"),
    "overflow_error": lambda: OverflowError("too big"),
    "raw_not_implemented": lambda: NotImplementedError("raw not implemented"),
    "asyncio_timeout": lambda: TimeoutError(),
    "str_raises": lambda: StrRaises(),
    "engine_dead": lambda: OmniEngineDeadError(stage_id=3, reason="SIGKILL"),
    # Leak probes: each hides something that must never reach a client.
    "leak_path": lambda: VLLMClientError("cannot open /home/alice/.cache/model.bin"),
    "leak_traceback": lambda: VLLMClientError(
        'Traceback (most recent call last):\n  File "/srv/app/x.py", line 3, in f\n'
        "    boom()\nbad input"
    ),
    "leak_bearer": lambda: VLLMServerError(
        "upstream said 401 for Authorization: Bearer abcDEF123.secret"
    ),
    "leak_sk": lambda: VLLMClientError("invalid key sk-proj-SECRET123456"),
    "leak_data_uri": lambda: VLLMUnprocessableEntityError(
        "bad image data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB",
        parameter="image",
    ),
    "leak_value": lambda: VLLMValidationError(
        "seed out of range", parameter="seed", value="hf_SECRETVALUE123"
    ),
}


class FakeEngineClient:
    """Stands in for the engine in boundary tests (no stages needed here).

    The real engine is covered by the runtime and server tests; the boundary
    only reads ``errored``, ``is_running`` and ``should_keep_api_server_alive``.
    """

    def __init__(self) -> None:
        self.errored = False
        self.is_running = True
        self.should_keep_api_server_alive = False


class Body(BaseModel):
    temperature: float = Field(ge=0, le=2)
    prompt: str


def build_app(mode: str = "strict") -> FastAPI:
    app = FastAPI()
    app.state.engine_client = FakeEngineClient()

    @app.post("/v1/raise/{name}")
    async def raise_named(name: str) -> dict[str, str]:
        if name == "engine_dead":
            app.state.engine_client.errored = True
            app.state.engine_client.is_running = False
        raise RAISERS[name]()

    @app.post("/v1/validated")
    async def validated(body: Body) -> dict[str, str]:
        return {"ok": body.prompt}

    @app.get("/v1/ok")
    async def ok() -> dict[str, str]:
        return {"status": "ok"}

    install_error_handling(app, mode=mode)  # type: ignore[arg-type]
    # Mounted after the boundary, as vLLM mounts it: order must not matter.
    Instrumentator(excluded_handlers=["/metrics"]).instrument(app).expose(app)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="strict")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    app = build_app(args.mode)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
    )
    app.state.server = server
    server.run()
    # Skip the interpreter teardown of torch/vLLM (seconds); the server has
    # already shut down cleanly, as `vllm-omni serve` does.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
