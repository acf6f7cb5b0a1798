"""``/openapi.json`` narrowed to a pipeline, without a server (``openapi/``).

The stage grammars are regexes in the document: each matches exactly what
the stage (and the route) accepts, compared value by value. The document of
a pipeline is built on a stand-in engine: for the reference text stage and
for a ``vllm`` stage, which keeps upstream's schema for what upstream
validates and the defaults of what nobody honours.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import threading
from typing import Any

import httpx
import jsonschema_rs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vllm_omni.config import StageConfig
from vllm_omni.entrypoints.openai import fields
from vllm_omni.entrypoints.openai.openapi import (
    decimal_pattern,
    served,
    size_pattern,
)
from vllm_omni.entrypoints.openai.schema_errors import NOT_BLANK
from vllm_omni.errors import VLLMValidationError
from vllm_omni.errors.http.schema import component_schemas
from vllm_omni.stages import image, text, video
from vllm_omni.stages.base import parse_size

MODEL = "omni-reference"


def _matches(pattern: str, value: str) -> bool:
    """As the server and schemathesis read a pattern (ECMA-262)."""
    return jsonschema_rs.is_valid({"type": "string", "pattern": pattern}, value)


def _stage_accepts_size(value: str, low: int, high: int) -> bool:
    try:
        parse_size({"size": value}, "1x1", low, high)
    except VLLMValidationError:
        return False
    return True


SIZES = st.one_of(
    st.builds(
        "{}{}{}".format,
        st.integers(0, 1100).map(str)
        | st.from_regex(r"0{0,3}[0-9]{1,4}", fullmatch=True),
        st.sampled_from(["x", "X", "*", ""]),
        st.integers(0, 1100).map(str)
        | st.from_regex(r"0{0,3}[0-9]{1,4}", fullmatch=True),
    ),
    st.text(max_size=12),
)


@settings(max_examples=400, deadline=None)
@given(value=SIZES)
@example("64x64")
@example("0064X1024")
@example("512x520")
@example("64x64\n")
@example("\u0666\u0664x64")
@example("00064x64")
@example("000064x64")
def test_size_pattern_is_the_stages_grammar(value: str) -> None:
    for low, high in (image.SIZE_RANGE, video.SIZE_RANGE):
        assert _matches(size_pattern(low, high), value) == _stage_accepts_size(
            value, low, high
        ), value


def _route_and_stage_accept_seconds(value: str) -> bool:
    from vllm_omni.entrypoints.openai.serving_videos import parse_seconds

    try:
        seconds = parse_seconds(value)
    except VLLMValidationError:
        return False
    low, high = video.SECONDS_RANGE
    return seconds is not None and low <= seconds <= high


BLANKS = st.sampled_from(["", " ", "\t", "\x1c", "\u2029", "\u3000"])
SECONDS = st.one_of(
    st.builds(
        "{}{}{}".format,
        BLANKS,
        st.decimals(0, 20, places=3).map(str)
        | st.from_regex(r"0{0,3}[0-9]{1,2}(\.[0-9]{0,4})?", fullmatch=True),
        BLANKS,
    ),
    st.floats(0, 12).map(str),
    st.text(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(value=SECONDS)
@example(" 0.1 ")
@example("\x1c10.000\u3000")
@example("0.05")
@example("0.099")
@example("10.001")
@example("0000.5")
@example("00000.5")
@example("4.")
@example(".5")
def test_seconds_pattern_is_the_video_route_and_stage(value: str) -> None:
    pattern = decimal_pattern(*video.SECONDS_RANGE, int_digits=4, frac_digits=3)
    assert _matches(pattern, value) == _route_and_stage_accept_seconds(value), value


@pytest.mark.parametrize(
    ("value", "blank"),
    [("", True), (" \t\n", True), ("\x1c\x1f\u2029\u3000", True), (" a ", False)],
)
def test_nonblank_is_str_strip(value: str, blank: bool) -> None:
    assert jsonschema_rs.is_valid({"type": "string", **NOT_BLANK}, value) is not blank
    assert (not value.strip()) is blank


# -- the document of a pipeline -------------------------------------------------------


class _Engine:
    """What ``served`` reads of an engine: its model and its stages."""

    def __init__(self, stages: dict[str, StageConfig]) -> None:
        self.model_name = MODEL
        self._stages = stages

    def stage_for(self, modality: str) -> StageConfig | None:
        return self._stages.get(modality)


REFERENCE = {
    "text": StageConfig(1, "thinker", "text"),
    "audio": StageConfig(2, "talker", "talker"),
    "image": StageConfig(4, "image", "image"),
    "video": StageConfig(5, "video", "video"),
}
VLLM = {"text": StageConfig(0, "llm", "vllm")}


def _document(stages: dict[str, StageConfig]) -> dict[str, Any]:
    from vllm_omni.entrypoints.openai.api_server import build_app

    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    app.state.engine_client = _Engine(stages)
    document = app.openapi()
    assert document is served(app)
    return document


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return _document(REFERENCE)


@pytest.fixture(scope="module")
def with_vllm() -> dict[str, Any]:
    return _document(VLLM)


def _request(document: dict[str, Any], name: str) -> dict[str, Any]:
    return document["components"]["schemas"][name]  # type: ignore[no-any-return]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def test_reference_text_stage_domains(reference: dict[str, Any]) -> None:
    chat = _request(reference, "ChatCompletionRequest")["properties"]
    tokens = {"type": "integer", "minimum": 1, "maximum": text.MAX_TOKENS_LIMIT}
    assert chat["max_tokens"] == _nullable(tokens)
    assert chat["max_completion_tokens"] == _nullable(tokens)
    low, high = text.TEMPERATURE_RANGE
    assert chat["temperature"] == _nullable(
        {"type": "number", "minimum": low, "maximum": high}
    )
    assert chat["n"] == _nullable(
        {"type": "integer", "minimum": 1, "maximum": text.MAX_CHOICES}
    )
    assert chat["stop"]["anyOf"][0]["anyOf"][1]["maxItems"] == text.MAX_STOP
    assert chat["model"] == _nullable(
        {"type": "string", "const": MODEL, "description": "the served model"}
    )


def test_fields_nobody_here_honours_take_their_default_only(
    reference: dict[str, Any],
) -> None:
    chat = _request(reference, "ChatCompletionRequest")["properties"]
    refused = {
        name
        for name in chat
        if (rule := fields.CHAT.get(name)) is None
        or not rule.honoured_by & {fields.ROUTE, "text"}
    }
    assert refused >= {"top_p", "logprobs", "tools", "use_beam_search", "lora"}
    for name in refused:
        schema = chat[name]
        # A fresh id by default: never to be sent.
        if name == "request_id":
            assert schema is False
            continue
        assert set(schema) == {"enum", "description"}, name
        assert schema["description"].startswith("Refused on this pipeline: ")
    assert chat["top_p"]["enum"] == [None]
    assert chat["logprobs"]["enum"] == [None, False]
    assert chat["bad_words"]["enum"] == [[]]


def test_reference_media_domains(reference: dict[str, Any]) -> None:
    generation = _request(reference, "ImageGenerationRequest")["properties"]
    assert generation["n"] == {"type": "integer", "minimum": 1, "maximum": 10}
    assert generation["size"]["pattern"] == size_pattern(*image.SIZE_RANGE)
    assert generation["quality"]["enum"] == ["auto"]
    speech = _request(reference, "SpeechRequest")["properties"]
    from vllm_omni.stages.speech import VOICES

    assert speech["voice"]["enum"] == sorted(VOICES)
    assert speech["instructions"]["enum"] == [None]
    edits = reference["paths"]["/v1/images/edits"]["post"]["requestBody"]
    encoding = edits["content"]["multipart/form-data"]["encoding"]
    assert encoding == {
        "image": {"contentType": "image/png, image/jpeg, image/gif, image/webp"}
    }
    videos = reference["paths"]["/v1/videos"]["post"]["requestBody"]["content"]
    assert set(videos) == {
        "application/json",
        "multipart/form-data",
        "application/x-www-form-urlencoded",
    }
    form = videos["multipart/form-data"]["schema"]["properties"]
    assert form["size"]["pattern"] == size_pattern(*video.SIZE_RANGE, times="x")
    listing = reference["paths"]["/v1/videos"]["get"]["parameters"]
    assert [p["name"] for p in listing] == ["limit", "order", "after"]


def test_a_vllm_stage_keeps_upstreams_schema(with_vllm: dict[str, Any]) -> None:
    chat = _request(with_vllm, "ChatCompletionRequest")["properties"]
    # Honoured by upstream, validated by upstream: its schema, unchanged.
    assert chat["top_p"] == {
        "anyOf": [{"type": "number"}, {"type": "null"}],
        "title": "Top P",
    }
    assert chat["max_tokens"]["anyOf"][0] == {"type": "integer"}
    # Nobody honours these: the default only.
    assert chat["use_beam_search"]["enum"] == [False]
    assert chat["tool_choice"] == {"enum": ["none", None]}
    custom = _request(with_vllm, "CustomChatCompletionMessageParam")
    assert custom["properties"]["role"]["enum"][0] == "system"


@pytest.mark.parametrize(
    ("stages", "body", "valid"),
    [
        # Non-text parts are a vllm stage's to render, not the reference's.
        (
            "vllm",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AAAA"},
                            },
                        ],
                    }
                ]
            },
            True,
        ),
        (
            "reference",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "x"}},
                        ],
                    }
                ]
            },
            False,
        ),
        ("vllm", {"messages": [{"role": "wizard", "content": "hi"}]}, False),
        ("vllm", {"messages": [{"role": "user", "content": " "}]}, False),
        ("reference", {"messages": [{"role": "user", "content": "hi"}]}, True),
    ],
)
def test_chat_messages_by_stage(
    reference: dict[str, Any],
    with_vllm: dict[str, Any],
    stages: str,
    body: dict[str, Any],
    valid: bool,
) -> None:
    document = with_vllm if stages == "vllm" else reference
    schema = {
        **_request(document, "ChatCompletionRequest"),
        "components": document["components"],
    }
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(body) is valid


def test_patterns_are_ecma_and_python_alike() -> None:
    """A pattern means the same in the document's dialect and in Python's
    (hypothesis draws positive values with Python's)."""
    for pattern in (
        size_pattern(*image.SIZE_RANGE),
        decimal_pattern(*video.SECONDS_RANGE, int_digits=4, frac_digits=3),
    ):
        re.compile(pattern)
        jsonschema_rs.validator_for({"pattern": pattern})


def test_the_error_event_is_published_beside_the_envelope(
    reference: dict[str, Any],
) -> None:
    schemas = reference["components"]["schemas"]
    for name, schema in component_schemas().items():
        assert schemas[name] == schema
    assert "retryable" in schemas["ErrorEventObject"]["required"]


async def test_openapi_json_waits_for_the_document_without_holding_the_loop() -> None:
    from vllm_omni.entrypoints.openai.api_server import build_app
    from vllm_omni.entrypoints.openai.openapi.document import narrowed

    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    engine = _Engine(REFERENCE)
    app.state.engine_client = engine
    gate = threading.Event()

    def build_when_let() -> Any:
        gate.wait(10)
        return narrowed(app, engine)  # type: ignore[arg-type]

    app.state.openapi_task = asyncio.create_task(asyncio.to_thread(build_when_let))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        pending = asyncio.create_task(client.get("/openapi.json"))
        # The loop keeps running while the document is built (FastAPI's own
        # route built it here, on the loop, and was done by now).
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not pending.done()
        gate.set()
        response = await pending
    assert response.status_code == 200
    assert response.json() == app.state.openapi_task.result().document


def _upstream_reads_empty_tools_as_none() -> bool:
    """Asked of upstream's own chat request model, as a client would find out."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
    )

    try:
        ChatCompletionRequest.model_validate({"messages": HI_MESSAGES, "tools": []})
    except Exception:
        return False
    return True


HI_MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("stages", ["vllm", "reference"])
def test_an_empty_tools_list_is_admitted_where_upstream_admits_it(
    reference: dict[str, Any], with_vllm: dict[str, Any], stages: str
) -> None:
    """vLLM 0.34 reads ``tools: []`` as no tools, 0.33 refuses it: the
    document follows the installed vLLM; a non-empty list without a
    ``tool_choice`` stays refused (upstream would make it ``auto``)."""
    document = with_vllm if stages == "vllm" else reference
    validator = jsonschema_rs.Draft202012Validator(
        {
            **_request(document, "ChatCompletionRequest"),
            "components": document["components"],
        }
    )
    empty = {"messages": HI_MESSAGES, "tools": []}
    assert validator.is_valid(empty) is _upstream_reads_empty_tools_as_none()
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert not validator.is_valid({"messages": HI_MESSAGES, "tools": [tool]})
