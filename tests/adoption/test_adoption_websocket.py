"""vllm-omni's WebSocket routes render their error events through the one
renderer: ``event["error"]`` is the canonical error object (its status's
type, ``param`` when a field is at fault, nothing private), 0.30's flat
``message`` beside it for one release.

A real ``websockets`` client against the real app: a route the pipeline
does not serve (refused, 501), a session message that does not validate
(400 naming the field, without the rejected value) on the streaming speech
and streaming video output routes.
"""

from __future__ import annotations

import json
from typing import Any

import contract
import scenarios
from websockets.sync.client import connect


def _ws_url(server: Any, path: str) -> str:
    return server.base_url.replace("http://", "ws://", 1) + path


def _first_error(server: Any, path: str, *send: dict[str, Any]) -> dict[str, Any]:
    """Open ``path``, send ``send``, return the first error event."""
    with connect(_ws_url(server, path), open_timeout=30, close_timeout=5) as ws:
        for message in send:
            ws.send(json.dumps(message))
        while True:
            frame = ws.recv(timeout=60)
            if isinstance(frame, bytes):
                continue
            event: dict[str, Any] = json.loads(frame)
            if event.get("type") == "error":
                return event


def _assert_error_event(event: dict[str, Any], status: int) -> dict[str, Any]:
    assert "error" in event and isinstance(event["error"], dict), (
        f"the error event has no canonical error object: {event}"
    )
    error: dict[str, Any] = event["error"]
    contract.assert_canonical(error, status)
    # 0.30's flat field stays for one release, equal to the canonical text.
    assert event.get("message") == error["message"], event
    contract.assert_no_leak(json.dumps(event))
    return error


def test_unavailable_websocket_route_is_a_canonical_501(diffusion_server: Any) -> None:
    """A video-generation pipeline serves no streaming video chat."""
    event = _first_error(diffusion_server, "/v1/video/chat/stream")
    error = _assert_error_event(event, 501)
    assert "not available" in error["message"]


def test_invalid_speech_session_config_is_400_naming_the_field(
    llm_server: Any,
) -> None:
    event = _first_error(
        llm_server,
        "/v1/audio/speech/stream",
        {"type": "session.config", "speed": scenarios.REJECTED},
    )
    assert _assert_error_event(event, 400)["param"] == "speed"


def test_bad_session_format_is_400_naming_the_field(diffusion_server: Any) -> None:
    event = _first_error(
        diffusion_server,
        "/v1/realtime/video",
        {"type": "session.start", "prompt": "a cat", "format": "mp4"},
    )
    assert _assert_error_event(event, 400)["param"] == "format"


def test_invalid_session_field_is_400_without_the_rejected_value(
    diffusion_server: Any,
) -> None:
    event = _first_error(
        diffusion_server,
        "/v1/realtime/video",
        {"type": "session.start", "prompt": "a cat", "num_frames": scenarios.REJECTED},
    )
    assert _assert_error_event(event, 400)["param"] == "num_frames"


def test_realtime_refusal_is_canonical_and_keeps_its_code(llm_server: Any) -> None:
    """``/v1/realtime?duplex=1`` on a pipeline without duplex: the refusal
    is the canonical 501; 0.30's top-level ``code`` stays beside it."""
    event = _first_error(llm_server, "/v1/realtime?duplex=1")
    _assert_error_event(event, 501)
    assert event.get("code") == "unsupported", event
