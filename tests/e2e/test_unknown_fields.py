"""A field a route does not know is a 400 naming it, never a 200 that
ignored it (issue 48), against real ``vllm-omni serve`` and the official SDK.

Each route (JSON, form and WebSocket event) refuses a misspelled field the
same way, in ``vllm_omni/entrypoints/openai/fields.py``: 400
``BadRequestError``, ``param`` the name as sent, and a message saying it is
not a field of the route, with the closest field's name when one is close.
The OpenAI API's own fields are all in the routes' tables (the SDK's
request parameters, read here), so one of them is refused with a reason,
never as unknown.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types import (
    completion_create_params,
    image_edit_params,
    image_generate_params,
    video_create_params,
)
from openai.types.audio import speech_create_params
from openai.types.chat import completion_create_params as chat_create_params
from PIL import Image
from websockets.sync.client import connect

from tests.e2e.omni_server import OmniServer
from vllm_omni.entrypoints.openai import fields
from vllm_omni.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")

MODEL = "omni-reference"
CHAT = "POST /v1/chat/completions"


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def _refused(call: Callable[[], Any], param: str, message: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    error = info.value.response.json()["error"]
    assert (error["type"], error["param"], error["message"]) == (
        "BadRequestError",
        param,
        message,
    )


def _not_a_field(name: str, operation: str, close: str | None) -> str:
    hint = f"; did you mean {close}?" if close else "."
    return f"{name} is not a field of this route ({operation}){hint}"


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], **kwargs
    )


# name: (call, param, the route's operation, the close name suggested);
# every route, as the SDK sends each.
MISSPELLED: dict[str, tuple[Callable[[openai.OpenAI], Any], str, str, str | None]] = {
    "chat max_token": (
        lambda c: _chat(c, extra_body={"max_token": 5}),
        "max_token",
        CHAT,
        "max_tokens",
    ),
    "chat temprature": (
        lambda c: _chat(c, extra_body={"temprature": 0.5}),
        "temprature",
        CHAT,
        "temperature",
    ),
    "chat, null value": (
        lambda c: _chat(c, extra_body={"max_token": None}),
        "max_token",
        CHAT,
        "max_tokens",
    ),
    "chat, nothing close": (
        lambda c: _chat(c, extra_body={"frobnicate": 1}),
        "frobnicate",
        CHAT,
        None,
    ),
    "chat, nested extra_body": (
        lambda c: _chat(c, extra_body={"extra_body": {"szie": "64x64"}}),
        "extra_body.szie",
        CHAT,
        "extra_body.size",
    ),
    "completions max_token": (
        lambda c: c.completions.create(
            model=MODEL, prompt="hello", extra_body={"max_token": 5}
        ),
        "max_token",
        "POST /v1/completions",
        "max_tokens",
    ),
    "speech voise": (
        lambda c: c.audio.speech.create(
            model=MODEL, input="hello", voice="alloy", extra_body={"voise": "alloy"}
        ),
        "voise",
        "POST /v1/audio/speech",
        "voice",
    ),
    "images szie": (
        lambda c: c.images.generate(
            model=MODEL, prompt="a cat", extra_body={"szie": "64x64"}
        ),
        "szie",
        "POST /v1/images/generations",
        "size",
    ),
    "image edits szie (form)": (
        lambda c: c.images.edit(
            model=MODEL,
            image=("in.png", _png(), "image/png"),
            prompt="a cat",
            extra_body={"szie": "64x64"},
        ),
        "szie",
        "POST /v1/images/edits",
        "size",
    ),
    "videos szie": (
        lambda c: c.videos.create(
            model=MODEL, prompt="a cat", extra_body={"szie": "64x64"}
        ),
        "szie",
        "POST /v1/videos",
        "size",
    ),
}


@pytest.mark.parametrize("case", sorted(MISSPELLED))
def test_a_misspelled_field_is_refused_by_name(
    client: openai.OpenAI, case: str
) -> None:
    call, param, operation, close = MISSPELLED[case]
    _refused(lambda: call(client), param, _not_a_field(param, operation, close))


def test_a_misspelled_field_in_a_video_form_is_refused(
    omni_server: OmniServer,
) -> None:
    """The videos route reads a form too (vllm-omni's clients post one)."""
    response = httpx.post(
        omni_server.base_url + "/v1/videos",
        headers=omni_server.headers(),
        files={"prompt": (None, "a cat"), "secnods": (None, "1")},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["message"]) == (
        "secnods",
        _not_a_field("secnods", "POST /v1/videos", "seconds"),
    )


def test_a_misspelled_field_of_a_realtime_response_is_refused(
    omni_server: OmniServer,
) -> None:
    url = omni_server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"
    with connect(url, additional_headers=omni_server.headers()) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        response = {"instructions": "hello", "voise": "alloy"}
        ws.send(
            json.dumps(
                {"type": "response.create", "event_id": "e1", "response": response}
            )
        )
        event = json.loads(ws.recv(timeout=10))
    assert event["type"] == "error"
    assert event["event_id"] == "e1"
    assert (event["error"]["param"], event["error"]["message"]) == (
        "response.voise",
        "response.voise is not a field of a response.create event's response; "
        "did you mean response.voice?",
    )


def test_an_openai_field_upstream_lacks_is_refused_with_its_reason(
    client: openai.OpenAI,
) -> None:
    _refused(
        lambda: _chat(client, store=True),
        "store",
        "store cannot be honoured: completions are not stored.",
    )
    _refused(
        lambda: client.images.generate(model=MODEL, prompt="a cat", complexity="low"),
        "complexity",
        "complexity cannot be honoured: complexity levels are not supported.",
    )
    # The OpenAI API's end-user id, like ``user``: accepted, no effect.
    reply = _chat(client, max_tokens=2, safety_identifier="user-1")
    assert reply.choices[0].message.content


# The OpenAI API's fields that upstream's request models do not define.
OPENAI_ONLY = {
    route: sorted(
        name
        for name, rule in fields.ROUTES[route][0].items()
        if name not in model.model_fields and not rule.honoured_by
    )
    for route, model in (
        ("chat", ChatCompletionRequest),
        ("completions", CompletionRequest),
    )
}


@pytest.mark.parametrize(
    ("route", "name"),
    [(route, name) for route, names in OPENAI_ONLY.items() for name in names],
)
def test_each_openai_field_upstream_lacks_is_refused(
    client: openai.OpenAI, route: str, name: str
) -> None:
    rule = fields.ROUTES[route][0][name]
    if route == "chat":
        call = lambda: _chat(client, extra_body={name: "x"})  # noqa: E731
    else:
        call = lambda: client.completions.create(  # noqa: E731
            model=MODEL, prompt="hello", extra_body={name: "x"}
        )
    _refused(call, name, f"{name} cannot be honoured: {rule.how}.")


def test_a_video_input_reference_is_refused(client: openai.OpenAI) -> None:
    """As JSON (a reference by URL); an uploaded one is a 501
    (tests/e2e/test_videos.py)."""
    _refused(
        lambda: client.videos.create(
            model=MODEL,
            prompt="a cat",
            extra_body={"input_reference": "https://example.com/cat.png"},
        ),
        "input_reference",
        "input_reference cannot be honoured: reference inputs are not supported.",
    )


# The SDK's request parameters of each route: the OpenAI API's fields.
SDK_PARAMS: dict[str, Any] = {
    "chat": chat_create_params.CompletionCreateParamsBase,
    "completions": completion_create_params.CompletionCreateParamsBase,
    "speech": speech_create_params.SpeechCreateParams,
    "image_generations": image_generate_params.ImageGenerateParamsBase,
    "image_edits": image_edit_params.ImageEditParamsBase,
    "videos": video_create_params.VideoCreateParams,
}


@pytest.mark.parametrize("route", sorted(SDK_PARAMS))
def test_every_openai_field_is_in_the_routes_table(route: str) -> None:
    """So an OpenAI field is honoured or refused with a reason, never
    refused as a misspelling; a newer SDK's field fails here until decided."""
    names = set(SDK_PARAMS[route].__annotations__)
    assert names
    assert names - set(fields.ROUTES[route][0]) == set()
