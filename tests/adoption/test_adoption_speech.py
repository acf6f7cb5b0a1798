"""vllm-omni's speech route after the raise-site review (phase 3): an
internal failure is a 500, a client's malformed field a 400 naming it.

``/v1/audio/speech`` on the LLM pipeline, whose fake engine answers text
only: the serving module's own check finds no audio in the model's output
(an internal failure it answered 400), and a ``ref_audio`` of the wrong
type is rejected by the request's validator.
"""

from __future__ import annotations

from typing import Any

import contract
import httpx

HANDLER = "/v1/audio/speech"


def _speech(base_url: str, **fields: Any) -> httpx.Response:
    body = {"model": "tiny", "input": "hello world", **fields}
    return httpx.post(f"{base_url}{HANDLER}", json=body, timeout=60)


def test_speech_without_audio_output_is_500(llm_server: Any) -> None:
    before = contract.requests_total(llm_server.base_url, HANDLER)
    response = _speech(llm_server.base_url)
    after = contract.requests_total(llm_server.base_url, HANDLER)
    assert response.status_code == 500, response.text
    contract.assert_envelope(response)
    assert after.get("5xx", 0) - before.get("5xx", 0) == 1


def test_malformed_ref_audio_is_400_naming_the_field(llm_server: Any) -> None:
    response = _speech(llm_server.base_url, ref_audio=123)
    assert response.status_code == 400, response.text
    assert contract.assert_envelope(response)["param"] == "ref_audio"
