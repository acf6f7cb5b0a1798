"""A failure after vllm-omni's chat stream started: one terminal SSE event.

The client already has HTTP 200 and the first chunks; the failure must
arrive as exactly one event carrying the canonical error object (nothing
private in it), after which the stream ends.
"""

from __future__ import annotations

from typing import Any

import contract
import httpx
import pytest
import scenarios


@pytest.mark.parametrize("name", scenarios.AFTER_FIRST)
def test_failure_after_stream_started_is_one_terminal_event(
    llm_server: Any, name: str
) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello world"}],
        "stream": True,
    }
    headers = {"X-Request-Id": scenarios.request_id(name)}
    with httpx.stream(
        "POST",
        f"{llm_server.base_url}/v1/chat/completions",
        json=body,
        headers=headers,
        timeout=60,
    ) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    text = "\n".join(lines)
    contract.assert_no_leak(text)
    events = contract.sse_events(lines)
    errors = [i for i, e in enumerate(events) if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1, f"{len(errors)} error events: {text[:800]}"
    (at,) = errors
    assert any(isinstance(e, dict) and e.get("choices") for e in events[:at]), (
        "the failure did not come after the stream started"
    )
    assert events[at + 1 :] in ([], ["[DONE]"]), (
        f"events after the error: {events[at + 1 :]}"
    )
    contract.assert_canonical(events[at]["error"], 500)
