"""``/openapi.json`` says what the server accepts, on the reference pipeline.

The served document is narrowed to the running pipeline (the reference
stages' domains, the served model), and a request body it does not admit is
a 400 naming the field, before any stage runs: these are the requests that
pydantic's lax parsing, or a rule no route checked, let through before.
Schemathesis checks the whole document in ``test_fuzz.py``; this module pins
each change of status, one request each, through the real server.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.canonical import assert_canonical_error
from tests.e2e.omni_server import OmniServer
from vllm_omni.stages import text

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def _post(server: OmniServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        server.base_url + path, json=body, headers=server.headers(), timeout=60
    )


def test_served_document_is_the_pipelines(omni_server: OmniServer) -> None:
    document = httpx.get(
        omni_server.base_url + "/openapi.json", headers=omni_server.headers()
    ).json()
    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == text.MAX_TOKENS_LIMIT
    assert chat["model"]["anyOf"][0]["const"] == "omni-reference"
    assert chat["top_p"]["enum"] == [None]


# (path, body, param): each a 200 before this change.
REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    "number as a string": (
        CHAT,
        {"messages": HI, "temperature": "0.5"},
        "temperature",
    ),
    "boolean as a number": (CHAT, {"messages": HI, "stream": 0}, "stream"),
    "integer as a boolean": (
        "/v1/completions",
        {"prompt": "hi", "max_tokens": True},
        "max_tokens",
    ),
    "message without text": (
        CHAT,
        {"messages": [*HI, {"role": "assistant", "content": None}]},
        "messages.1.content",
    ),
    "blank text part": (
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "text", "text": " "},
                    ],
                }
            ]
        },
        "messages.0.content.1.text",
    ),
    "message field the text stage does not read": (
        CHAT,
        {"messages": [{"role": "user", "content": "hi", "tool_call_id": "t"}]},
        "messages.0.tool_call_id",
    ),
    "modalities without text": (
        CHAT,
        {"messages": HI, "modalities": ["audio"]},
        "modalities",
    ),
    "speed as a string": (
        "/v1/audio/speech",
        {"input": "hi", "speed": "1.5"},
        "speed",
    ),
    "image count as a boolean": (
        "/v1/images/generations",
        {"prompt": "p", "n": True, "size": "64x64"},
        "n",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_document_does_not_admit_is_a_400(
    omni_server: OmniServer, case: str
) -> None:
    path, body, param = REFUSED[case]
    response = _post(omni_server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert_canonical_error(400, response.json(), response.headers)
    assert (error["type"], error["param"]) == ("BadRequestError", param)
    assert error.get("stage_id") is None


def test_modalities_without_text_say_what_is_missing(omni_server: OmniServer) -> None:
    """The message names what the list must hold, not the schema's shape."""
    response = _post(omni_server, CHAT, {"messages": HI, "modalities": ["audio"]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == "modalities must include 'text'"


def test_stage_domains_are_still_the_stages(omni_server: OmniServer) -> None:
    """A value of the right type outside a stage's domain is that stage's 400,
    with its ``stage_id``; the document states the domain too."""
    response = _post(omni_server, CHAT, {"messages": HI, "temperature": 5})
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["stage_id"]) == (
        400,
        "temperature",
        1,
    )


def test_max_tokens_is_checked_beside_max_completion_tokens(
    omni_server: OmniServer,
) -> None:
    response = _post(
        omni_server,
        CHAT,
        {"messages": HI, "max_completion_tokens": 5, "max_tokens": 10**6},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "max_tokens"


def test_unknown_video_cursor_is_a_404_on_after(omni_server: OmniServer) -> None:
    response = httpx.get(
        omni_server.base_url + "/v1/videos",
        params={"after": "video_unknown"},
        headers=omni_server.headers(),
    )
    assert response.status_code == 404, response.text
    assert_canonical_error(404, response.json(), response.headers)
    assert response.json()["error"]["param"] == "after"


def test_what_the_document_admits_is_honoured(omni_server: OmniServer) -> None:
    """The forms the narrowing keeps: text parts, ``name``, text and audio,
    an empty stop, a one-item prompt list."""
    body = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "hi", "name": "ann"},
        ],
        "modalities": ["text", "audio"],
        "audio": {"voice": "nova", "format": "wav"},
        "stop": "",
    }
    response = _post(omni_server, CHAT, body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["audio"]["data"]
    response = _post(omni_server, "/v1/completions", {"prompt": ["hi"]})
    assert response.status_code == 200, response.text


def test_form_seconds_between_unicode_blanks(omni_server: OmniServer) -> None:
    """Blanks ``str.strip`` removes and ``float`` does not (was a 500)."""
    response = httpx.post(
        omni_server.base_url + "/v1/videos",
        data={"prompt": "a ball", "seconds": "\x1c0.2\u3000", "size": "64x64"},
        headers=omni_server.headers(),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["seconds"] == "0.2"


def test_size_digits_are_ascii(omni_server: OmniServer) -> None:
    response = _post(
        omni_server,
        "/v1/images/generations",
        {"prompt": "p", "size": "\u0666\u0664x64"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "size"


# (path, body, param): upstream's before-validators raised TypeError or
# AttributeError on these, a 500: the field the model's JSON schema does not
# admit, else the field without which they pass.
WRONG_TYPES: dict[str, tuple[str, dict[str, Any], str]] = {
    "messages not a list": (CHAT, {"messages": 5}, "messages"),
    "structured_outputs not an object": (
        "/v1/completions",
        {"prompt": "hi", "structured_outputs": True},
        "structured_outputs",
    ),
    # Upstream logs a system message's non-text part by its type, as a key.
    "a system part whose type is a list": (
        CHAT,
        {"messages": [{"role": "system", "content": [{"type": ["text"]}]}]},
        "messages",
    ),
    "a tool not an object": (
        CHAT,
        {
            "messages": HI,
            "tools": [5],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        "tools.0",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_wrong_json_type_upstream_reads_raw_is_a_400(
    omni_server: OmniServer, case: str
) -> None:
    path, body, param = WRONG_TYPES[case]
    response = _post(omni_server, path, body)
    assert response.status_code == 400, response.text
    assert_canonical_error(400, response.json(), response.headers)
    assert response.json()["error"]["param"] == param


_PART = b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n'
MALFORMED_FORMS: dict[str, tuple[bytes, str]] = {
    "a part without a disposition": (
        b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--\r\n",
        "multipart/form-data; boundary=b",
    ),
    "a part over the part limit": (
        _PART + b"a" * (1024 * 1024 + 1) + b"\r\n--b--\r\n",
        "multipart/form-data; boundary=b",
    ),
    "more fields than the form limit": (
        b"&".join(b"f%d=1" % i for i in range(1200)),
        "application/x-www-form-urlencoded",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_FORMS))
def test_a_malformed_video_form_is_a_400(omni_server: OmniServer, case: str) -> None:
    """The Unicode check parses a form before the route does: a form that
    cannot be parsed was a 500 (the route's parse met a consumed stream)."""
    body, content_type = MALFORMED_FORMS[case]
    response = httpx.post(
        omni_server.base_url + "/v1/videos",
        content=body,
        headers={**omni_server.headers(), "content-type": content_type},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert_canonical_error(400, response.json(), response.headers)


def test_an_empty_tools_list_is_answered_as_upstream_answers_it(
    omni_server: OmniServer,
) -> None:
    """vLLM 0.34 reads ``tools: []`` as no tools (a reply), 0.33 refuses it
    (400 naming ``tools``): the server answers as the installed vLLM does."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
    )

    try:
        ChatCompletionRequest.model_validate({"messages": HI, "tools": []})
    except Exception:
        upstream_accepts = False
    else:
        upstream_accepts = True
    response = _post(omni_server, CHAT, {"messages": HI, "tools": []})
    if upstream_accepts:
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]
    else:
        assert response.status_code == 400, response.text
        assert_canonical_error(400, response.json(), response.headers)
        assert response.json()["error"]["param"] == "tools"
