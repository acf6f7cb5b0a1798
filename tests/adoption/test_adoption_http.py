"""Non-streaming HTTP errors of vllm-omni's chat route on an LLM pipeline.

Every failure a real engine raises (``scenarios``) and every client
mistake, sent with the official OpenAI SDK: the status equals
``error.code`` equals the status ``http_requests_total`` records; one
canonical envelope; an engine-side ``ValueError`` is a 500, a client
mistake a 4xx naming its ``param``; nothing private in any body.
"""

from __future__ import annotations

from typing import Any

import contract
import openai
import pytest
import scenarios

HANDLER = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello world"}]

# name -> (request keywords, the status the contract requires)
CASES: dict[str, tuple[dict[str, Any], int]] = {
    "value_error": ({}, 500),
    "value_error_secret": ({}, 500),
    "validation_top_k": ({}, 400),
    "not_found": ({}, 404),
    "generate_error": ({}, 500),
    "runtime_secret": ({}, 500),
    "guardrail": ({}, 400),
    "unknown_model": ({"model": "no-such-model"}, 404),
    "bad_temperature": ({"temperature": scenarios.REJECTED}, 400),
}
# A client mistake and the field it must name.
PARAMS = {
    "validation_top_k": "top_k",
    "unknown_model": "model",
    "bad_temperature": "temperature",
}


def _fail(base_url: str, name: str) -> openai.APIStatusError:
    keywords, _ = CASES[name]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
    request: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3}
    extra_body = {}
    for key, value in keywords.items():
        if key == "temperature":
            extra_body[key] = value
        else:
            request[key] = value
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            **request,
            extra_body=extra_body or None,
            extra_headers={"X-Request-Id": scenarios.request_id(name)},
        )
    return raised.value


@pytest.mark.parametrize("name", sorted(CASES))
def test_status_code_and_metric_agree(llm_server: Any, name: str) -> None:
    before = contract.requests_total(llm_server.base_url, HANDLER)
    error = _fail(llm_server.base_url, name)
    after = contract.requests_total(llm_server.base_url, HANDLER)
    status = error.status_code
    assert error.response.json()["error"]["code"] == status
    label = contract.status_label(status)
    grown = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert {k: v for k, v in grown.items() if v} == {label: 1.0}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_canonical_envelope(llm_server: Any, name: str) -> None:
    error = _fail(llm_server.base_url, name)
    assert error.status_code == CASES[name][1], error.response.text
    contract.assert_envelope(error.response)


@pytest.mark.parametrize("name", ["value_error", "value_error_secret"])
def test_engine_value_error_is_500(llm_server: Any, name: str) -> None:
    error = _fail(llm_server.base_url, name)
    assert isinstance(error, openai.InternalServerError), (
        f"an engine-side ValueError answered {error.status_code}: {error.response.text}"
    )


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_client_mistake_is_4xx_with_param(llm_server: Any, name: str) -> None:
    error = _fail(llm_server.base_url, name)
    assert 400 <= error.status_code < 500, error.response.text
    assert error.response.json()["error"]["param"] == PARAMS[name]


@pytest.mark.parametrize(
    "name", ["value_error_secret", "runtime_secret", "bad_temperature"]
)
def test_no_private_text_in_body(llm_server: Any, name: str) -> None:
    contract.assert_no_leak(_fail(llm_server.base_url, name).response.text)
