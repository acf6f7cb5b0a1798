"""``EngineDeadError`` keeps vllm-omni's termination behaviour.

A request whose engine died answers 500 with the canonical envelope, and
the server then shuts down (upstream's ``terminate_if_errored``, applied by
vllm-omni's engine error handling; ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``
unset).
"""

from __future__ import annotations

import time
from typing import Any

import contract
import httpx
import scenarios


def test_engine_dead_answers_500_and_the_server_exits(fresh_llm_server: Any) -> None:
    response = httpx.post(
        f"{fresh_llm_server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hello"}]},
        headers={"X-Request-Id": scenarios.request_id("dead")},
        timeout=60,
    )
    assert response.status_code == 500, response.text
    contract.assert_envelope(response)
    deadline = time.monotonic() + 30
    while fresh_llm_server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fresh_llm_server.process.poll() is not None, "the server kept running"
