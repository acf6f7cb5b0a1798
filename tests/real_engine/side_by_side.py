"""The requests sent to upstream's own OpenAI server and to ``vllm-omni serve``
side by side (``test_side_by_side.py``), and the answers that differ on
purpose.

Each case is a method, a path and a JSON body (``None``: no body). The
outcome compared is ``(status, error.type, error.param)``; a success is
``(200, None, None)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.omni_server import OmniServer
from tests.e2e.servers import free_port

MODEL = "tiny-qwen2"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "name": "answer",
    "schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
    },
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object"}},
    }
]


def _chat(**fields: Any) -> tuple[str, str, dict[str, Any]]:
    return ("POST", CHAT, {"model": MODEL, "messages": HI, "max_tokens": 4, **fields})


def _completion(**fields: Any) -> tuple[str, str, dict[str, Any]]:
    return (
        "POST",
        COMPLETIONS,
        {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields},
    )


CASES: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "chat": _chat(),
    "chat_stream": _chat(stream=True),
    "chat_n2": _chat(n=2),
    "chat_logprobs": _chat(logprobs=True, top_logprobs=3),
    "chat_stop": _chat(stop=["x"]),
    "chat_seed": _chat(seed=7, temperature=0.5, top_p=0.5, top_k=3, min_p=0.1),
    "chat_penalties": _chat(presence_penalty=1, frequency_penalty=1),
    "chat_json_object": _chat(response_format={"type": "json_object"}),
    "chat_json_schema": _chat(
        response_format={"type": "json_schema", "json_schema": SCHEMA}
    ),
    "chat_tools_none": _chat(tools=TOOLS, tool_choice="none"),
    "top_p_2": _chat(top_p=2),
    "top_k_negative": _chat(top_k=-5),
    "presence_penalty_5": _chat(presence_penalty=5),
    "frequency_penalty_negative": _chat(frequency_penalty=-3),
    "min_p_2": _chat(min_p=2),
    "temperature_negative": _chat(temperature=-1),
    "n_0": _chat(n=0),
    "stop_5": _chat(stop=5),
    "top_logprobs_1000": _chat(logprobs=True, top_logprobs=1000),
    "top_logprobs_without_logprobs": _chat(top_logprobs=2),
    "max_tokens_over_context": _chat(max_tokens=1000),
    "prompt_over_context": (
        "POST",
        CHAT,
        {"model": MODEL, "messages": [{"role": "user", "content": "a b " * 200}]},
    ),
    "invalid_json_schema": _chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "objectx"}},
        }
    ),
    "json_schema_missing": _chat(response_format={"type": "json_schema"}),
    "tools_auto": _chat(tools=TOOLS, tool_choice="auto"),
    "tools_required": _chat(tools=TOOLS, tool_choice="required"),
    "logit_bias_out_of_vocab": _chat(logit_bias={"100000": 5}),
    "allowed_token_ids_out_of_vocab": _chat(allowed_token_ids=[100000]),
    "min_tokens_over_max": _chat(min_tokens=10),
    "seed_not_int": _chat(seed="abc"),
    "temperature_as_string": _chat(temperature="0.5"),
    "messages_empty": ("POST", CHAT, {"model": MODEL, "messages": []}),
    "messages_missing": ("POST", CHAT, {"model": MODEL}),
    "unknown_model": ("POST", CHAT, {"model": "nope", "messages": HI}),
    "role_wizard": (
        "POST",
        CHAT,
        {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]},
    ),
    "chat_template_in_request": _chat(chat_template="{{ messages }}"),
    "beam_search": _chat(use_beam_search=True),
    "echo": _chat(echo=True),
    "misspelled_field": _chat(max_token=5),
    # issue 48: a string where include_usage is a boolean, streamed or not.
    "stream_options_string": _chat(
        stream=True, stream_options={"include_usage": "yes"}
    ),
    "stream_options_string_no_stream": _chat(stream_options={"include_usage": "yes"}),
    "completion_echo_logprobs": _completion(echo=True, logprobs=1),
    "completion": _completion(),
    "completion_stream": _completion(stream=True),
    "completion_n2_logprobs": _completion(n=2, logprobs=2),
    "completion_top_p_2": _completion(top_p=2),
    "completion_prompt_missing": ("POST", COMPLETIONS, {"model": MODEL}),
    "completion_echo": _completion(echo=True),
    "unknown_route": ("GET", "/v1/nope", None),
    "wrong_method": ("GET", CHAT, None),
    "invalid_json": ("POST", CHAT, None),
}

_BAD = "BadRequestError"
_SCHEMA = "Bad Request"  # upstream's type for a request-schema error

# Cases where vllm-omni answers differently on purpose: upstream's outcome,
# ours. Each is listed with its reason in docs/errors/status-mapping.md
# ("Differences from `vllm serve`"), under the heading of its kind.
CORRECTIONS: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    # The field is named where upstream names none.
    "top_k_negative": ((400, _BAD, None), (400, _BAD, "top_k")),
    "presence_penalty_5": ((400, _BAD, None), (400, _BAD, "presence_penalty")),
    "frequency_penalty_negative": (
        (400, _BAD, None),
        (400, _BAD, "frequency_penalty"),
    ),
    "min_p_2": ((400, _BAD, None), (400, _BAD, "min_p")),
    "n_0": ((400, _BAD, None), (400, _BAD, "n")),
    "min_tokens_over_max": ((400, _BAD, None), (400, _BAD, "min_tokens")),
    "invalid_json_schema": ((400, _BAD, None), (400, _BAD, "response_format")),
    "tools_auto": ((400, _BAD, None), (400, _BAD, "tool_choice")),
    "tools_required": ((400, _BAD, None), (400, _BAD, "tool_choice")),
    "messages_empty": ((400, _BAD, None), (400, _BAD, "messages")),
    "chat_template_in_request": ((400, _BAD, None), (400, _BAD, "chat_template")),
    # A request-schema error has the canonical type and the field's name.
    "stop_5": ((400, _SCHEMA, "body.stop"), (400, _BAD, "stop")),
    "seed_not_int": ((400, _SCHEMA, "body.seed"), (400, _BAD, "seed")),
    "messages_missing": ((400, _SCHEMA, "body.messages"), (400, _BAD, "messages")),
    "invalid_json": ((400, _SCHEMA, "body.1"), (400, _BAD, "body")),
    # Framework errors use the canonical envelope (upstream: {"detail": ...}).
    "unknown_route": ((404, None, None), (404, "NotFoundError", None)),
    "wrong_method": ((405, None, None), (405, "MethodNotAllowedError", None)),
    # Stricter: a role outside the OpenAI API.
    "role_wizard": ((200, None, None), (400, _BAD, "messages.0.role")),
    # A value of another JSON type than the field's: pydantic's lax parsing
    # takes it upstream; /openapi.json does not admit it.
    "temperature_as_string": ((200, None, None), (400, _BAD, "temperature")),
    "stream_options_string": (
        (200, None, None),
        (400, _BAD, "stream_options.include_usage"),
    ),
    # Not supported here: refused, never ignored.
    "beam_search": ((200, None, None), (400, _BAD, "use_beam_search")),
    "echo": ((200, None, None), (400, _BAD, "echo")),
    "completion_echo": ((200, None, None), (400, _BAD, "echo")),
    "completion_echo_logprobs": ((200, None, None), (400, _BAD, "echo")),
    # Not a field of the route: refused by name (upstream logs and ignores it).
    "misspelled_field": ((200, None, None), (400, _BAD, "max_token")),
}


def outcome(client: httpx.Client, case: str) -> tuple[int, str | None, str | None]:
    """``(status, error.type, error.param)`` of one case against ``client``."""
    method, path, body = CASES[case]
    if case == "invalid_json":
        response = client.request(
            method, path, content=b"{oops", headers={"content-type": "application/json"}
        )
    else:
        response = client.request(method, path, json=body)
    if response.status_code < 400:
        if body and body.get("stream"):
            assert b"data: [DONE]" in response.content, response.text[:500]
        return (response.status_code, None, None)
    try:
        error = response.json().get("error")
    except ValueError:
        error = None
    if not isinstance(error, dict):
        return (response.status_code, None, None)
    return (response.status_code, error.get("type"), error.get("param"))


def start_upstream_server(directory: Path, engine_args: dict[str, Any]) -> OmniServer:
    """Upstream's own server with the pipeline's engine arguments (spawned,
    not waited for: ``conftest.running_servers`` waits)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--model",
        str(engine_args["model"]),
        "--max-model-len",
        str(engine_args["max_model_len"]),
        "--dtype",
        str(engine_args["dtype"]),
        "--max-num-seqs",
        str(engine_args["max_num_seqs"]),
        "--enforce-eager",
    ]
    log_path = directory / f"upstream-{port}.log"
    proc = subprocess.Popen(
        argv,
        env=dict(os.environ),
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return OmniServer(proc, f"http://127.0.0.1:{port}", log_path)
