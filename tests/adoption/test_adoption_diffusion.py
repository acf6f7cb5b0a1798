"""vllm-omni's routes on a pure diffusion pipeline with video output.

The chat route, the synchronous video route and the asynchronous video
job: the same envelope, status, ``param`` and privacy as the LLM routes;
a failed job stores the canonical error, retrieved as stored.
"""

from __future__ import annotations

import time
from typing import Any

import contract
import httpx
import scenarios


def test_unknown_model_on_diffusion_chat_is_404(diffusion_server: Any) -> None:
    response = httpx.post(
        f"{diffusion_server.base_url}/v1/chat/completions",
        json={
            "model": "no-such-model",
            "messages": [{"role": "user", "content": "hi"}],
        },
        timeout=60,
    )
    assert response.status_code == 404, response.text
    assert contract.assert_envelope(response)["param"] == "model"


def test_sync_video_failure_is_canonical(diffusion_server: Any) -> None:
    handler = "/v1/videos/sync"
    before = contract.requests_total(diffusion_server.base_url, handler)
    response = httpx.post(
        f"{diffusion_server.base_url}{handler}",
        data={"prompt": scenarios.prompt("runtime_secret"), "model": "tiny"},
        timeout=60,
    )
    after = contract.requests_total(diffusion_server.base_url, handler)
    assert response.status_code == 500, response.text
    contract.assert_no_leak(response.text)
    contract.assert_envelope(response)
    assert after.get("5xx", 0) - before.get("5xx", 0) == 1


def test_failed_video_job_stores_the_canonical_error(diffusion_server: Any) -> None:
    base = diffusion_server.base_url
    created = httpx.post(
        f"{base}/v1/videos",
        data={"prompt": scenarios.prompt("runtime_secret"), "model": "tiny"},
        timeout=60,
    )
    assert created.status_code == 200, created.text
    video_id = created.json()["id"]
    deadline = time.monotonic() + 30
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{base}/v1/videos/{video_id}", timeout=10).json()
        if job.get("status") == "failed":
            break
        time.sleep(0.2)
    assert job.get("status") == "failed", job
    contract.assert_no_leak(str(job))
    contract.assert_canonical(job["error"], 500)


def test_bad_lora_on_sync_video_is_400_naming_the_field(diffusion_server: Any) -> None:
    response = httpx.post(
        f"{diffusion_server.base_url}/v1/videos/sync",
        data={"prompt": "a cat", "model": "tiny", "lora": '{"name": "only-a-name"}'},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert contract.assert_envelope(response)["param"] == "lora"
