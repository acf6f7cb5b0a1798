"""The two requests issue 48 found answered differently from ``vllm serve``,
sent with the official SDK to real ``vllm-omni serve``; each difference is
documented with its reason (docs/errors/status-mapping.md, "Differences from
``vllm serve``"; ``tests/real_engine/side_by_side.py`` pins upstream's side).

- ``stream_options: {"include_usage": "yes"}``: upstream's pydantic reads
  "yes" as true (lax mode) and streams; here a body is held to
  ``/openapi.json``, where ``include_usage`` is a boolean: a 400 naming it.
  Without ``stream: true`` both answer upstream's 400 on ``stream_options``.
- a completion with ``echo`` and ``logprobs``: upstream echoes the prompt
  with its logprobs; echo is not supported here, so it is a 400 on ``echo``
  whatever ``logprobs`` says.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

MODEL = "omni-reference"


def _error(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    error: dict[str, Any] = info.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    return error


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], **kwargs
    )


def test_include_usage_as_a_string_is_refused_by_name(client: openai.OpenAI) -> None:
    error = _error(
        lambda: _chat(client, stream=True, stream_options={"include_usage": "yes"})
    )
    assert (error["param"], error["message"]) == (
        "stream_options.include_usage",
        "stream_options.include_usage must be of type null or boolean",
    )
    # As a boolean it is honoured: the last chunk carries the usage.
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_stream_options_without_stream_is_upstreams_400(client: openai.OpenAI) -> None:
    error = _error(lambda: _chat(client, stream_options={"include_usage": "yes"}))
    assert (error["param"], error["message"]) == (
        "stream_options",
        "Stream options can only be defined when `stream=True`.",
    )


@pytest.mark.parametrize("logprobs", [None, 1])
def test_echo_is_refused_with_or_without_logprobs(
    client: openai.OpenAI, logprobs: int | None
) -> None:
    error = _error(
        lambda: client.completions.create(
            model=MODEL, prompt="hello", echo=True, logprobs=logprobs
        )
    )
    assert (error["param"], error["message"]) == (
        "echo",
        "echo cannot be honoured: echo is not supported.",
    )
