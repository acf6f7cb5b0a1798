"""vllm-omni 0.30.0's real OpenAI server around a fake engine client.

Run as a script (``python tests/adoption/omni_server.py --pipeline llm
--port N --model DIR``) by ``tests/adoption/conftest.py``, with the tree
under test (pristine or patched) first on ``PYTHONPATH``. The app is built
the way ``omni_run_server_worker``
(``vllm_omni/entrypoints/openai/api_server.py``) builds it: vLLM's
``build_app``, the routes vllm-omni replaces removed, vllm-omni's router,
``_register_omni_exception_handlers``, ``omni_init_app_state``, the
route restrictions; then vLLM's own ``serve_http`` (real uvicorn, the
engine watchdog, ``app.state.server`` for ``terminate_if_errored``).

Only the engine is fake (where a GPU would run): it raises what a real one
raises, chosen by the request (``scenarios``).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))

import cpu
import scenarios

cpu.prepare()


def _failure(name: str) -> BaseException:
    """The exception a real engine raises for scenario ``name``."""
    from vllm.exceptions import VLLMNotFoundError, VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    from vllm_omni.errors import GuardrailViolationError

    secret_text = (
        f"tensor conversion failed at {scenarios.PATH} with api_key="
        f"{scenarios.SECRET}\n{scenarios.TRACEBACK}"
    )
    table: dict[str, BaseException] = {
        "value_error": ValueError("could not broadcast logits to the vocab size"),
        "value_error_secret": ValueError(secret_text),
        "validation_top_k": VLLMValidationError(
            "top_k must be -1 or at least 1", parameter="top_k", value=0
        ),
        "not_found": VLLMNotFoundError("LoRA adapter 'nobody' was not found"),
        "generate_error": EngineGenerateError(),
        "runtime_secret": RuntimeError(secret_text),
        "stream_generate_error": EngineGenerateError(),
        "stream_runtime_secret": RuntimeError(secret_text),
        "guardrail": GuardrailViolationError("Input was blocked by the guardrail."),
        "dead": EngineDeadError(),
    }
    return table[name]


def _stage(**fields: Any) -> Any:
    """A stage config as vllm-omni loads one (an OmegaConf mapping: read
    with ``.get`` and as attributes, an unset key reads as None)."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {"stage_id": 0, "final_output": True, "engine_args": {}, **fields}
    )


class FakeEngineClient:
    """What ``AsyncOmni`` offers the server, with the engine faked."""

    def __init__(self, pipeline: str, model: str) -> None:
        from vllm.sampling_params import SamplingParams

        self.pipeline = pipeline
        self.errored = False
        self.is_running = True
        self.dead_error: BaseException | None = None
        self.endpoint_restrictions: Any = None
        if pipeline == "llm":
            # vLLM inspects a lazily registered architecture in a fresh
            # interpreter, where torchvision cannot import (cpu.py); the
            # class registered by value is inspected here instead.
            from vllm import ModelRegistry
            from vllm.engine.arg_utils import EngineArgs
            from vllm.model_executor.models.gpt2 import GPT2LMHeadModel
            from vllm.renderers import renderer_from_config
            from vllm.v1.engine.input_processor import InputProcessor

            ModelRegistry.register_model("GPT2LMHeadModel", GPT2LMHeadModel)
            self.vllm_config: Any = EngineArgs(model=model).create_engine_config()
            self.model_config = self.vllm_config.model_config
            self.renderer = renderer_from_config(self.vllm_config)
            self.input_processor = InputProcessor(self.vllm_config, self.renderer)
            self.stage_configs = [
                _stage(
                    stage_type="llm", is_comprehension=True, final_output_type="text"
                )
            ]
            self.output_modalities = ["text"]
            self.default_sampling_params_list: list[Any] = [SamplingParams()]
        else:
            from vllm_omni.inputs.data import OmniDiffusionSamplingParams

            self.vllm_config = None
            self.model_config = None
            self.renderer = None
            self.input_processor = None
            self.stage_configs = [
                _stage(stage_type="diffusion", final_output_type="video")
            ]
            self.output_modalities = ["video"]
            self.default_sampling_params_list = [OmniDiffusionSamplingParams()]
        self.request_states: dict[str, Any] = {}

    async def get_vllm_config(self) -> Any:
        return self.vllm_config

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def get_tokenizer(self) -> Any:
        return self.renderer.get_tokenizer() if self.renderer is not None else None

    async def check_health(self) -> None:
        if self.errored:
            raise self.dead_error or RuntimeError("engine dead")

    async def is_sleeping(self) -> bool:
        return False

    async def abort(self, request_id: Any, *args: Any, **kwargs: Any) -> None:
        return None

    async def do_log_stats(self, *args: Any, **kwargs: Any) -> None:
        return None

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def generate(
        self, prompt: Any = None, request_id: str = "", *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        name = scenarios.named(request_id, prompt)
        if name in scenarios.AFTER_FIRST:
            yield self._output(request_id, prompt, finished=False)
            await asyncio.sleep(0)
            raise _failure(name)
        if name == "dead":
            self.errored = True
            self.is_running = False
            self.dead_error = _failure(name)
            raise self.dead_error
        if name != "ok":
            raise _failure(name)
        yield self._output(request_id, prompt, finished=True)

    def _output(self, request_id: str, prompt: Any, *, finished: bool) -> Any:
        from vllm.outputs import CompletionOutput

        from vllm_omni.outputs import OmniRequestOutput

        token_ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        return OmniRequestOutput(
            request_id=request_id,
            prompt_token_ids=token_ids or [3],
            outputs=[
                CompletionOutput(
                    index=0,
                    text="hello",
                    token_ids=[3],
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason="stop" if finished else None,
                )
            ],
            finished=finished,
            stage_id=0,
            final_output_type="text",
        )


def _args(model: str) -> Any:
    """The server's arguments, parsed by vllm-omni's own ``serve`` parser."""
    from vllm_omni.entrypoints.cli.serve import OmniServeCommand

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    command = OmniServeCommand()
    serve_parser = command.subparser_init(subparsers)
    return serve_parser.parse_args(
        [model, "--omni", "--model", model, "--served-model-name", "tiny"]
    )


async def serve(pipeline: str, model: str, port: int) -> None:
    from vllm.entrypoints.launchers.launcher import serve_http

    from vllm_omni.entrypoints.openai import api_server
    from vllm_omni.entrypoints.openai import app_state as openai_app_state

    args = _args(model)
    engine_client = FakeEngineClient(pipeline, model)
    supported_tasks = tuple(await engine_client.get_supported_tasks())
    app = api_server.build_openai_app(args, supported_tasks)
    app.state.api_server_count = 1
    api_server.remove_route_from_app(app, "/v1/chat/completions", {"POST"})
    api_server.remove_route_from_app(app, "/v1/chat/completions/batch", {"POST"})
    api_server.remove_route_from_app(app, "/v1/models", {"GET"})
    api_server.remove_route_from_app(app, "/health", {"GET"})
    app.include_router(api_server.router)
    api_server._register_omni_exception_handlers(app)
    await api_server.omni_init_app_state(engine_client, app.state, args)
    if engine_client.endpoint_restrictions is not None:
        api_server.shutdown_unsupported_routes(app, engine_client.endpoint_restrictions)
    await api_server.STORAGE_MANAGER.start()
    if await openai_app_state._get_vllm_config(engine_client) is None:
        app.state.engine_client = api_server.PureDiffusionLauncherAdapter(
            engine_client, shutdown_timeout=0
        )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    print(f"omni-server ready on 127.0.0.1:{port}", flush=True)
    shutdown = await serve_http(
        app, sock=sock, host="127.0.0.1", port=port, log_level="warning"
    )
    await shutdown
    sock.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipeline", choices=("llm", "diffusion"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    asyncio.run(serve(options.pipeline, options.model, options.port))


if __name__ == "__main__":
    main()
