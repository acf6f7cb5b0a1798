"""The docs quote what the server sends (issue 48): every error message
that ``docs/serving.md`` and ``docs/errors/http.md`` quote as a response is
sent here, for the request the docs show, to the reference server, and must
come back word for word with the status quoted.

``QUOTES`` is the table: a documented request → its status and the exact
message the docs quote. ``test_every_quoted_message_has_a_case`` reads the
docs for every ``"message": "..."`` in a quoted response (a JSON line, an
SSE ``data:`` line, a ``#`` comment showing a body) so that a new quote
fails until it has a case here; the few that need a dead engine or a
faulted one are listed in ``ELSEWHERE`` with the test that sends them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.e2e.omni_server import OmniServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = {
    "serving": ROOT / "docs" / "serving.md",
    "http": ROOT / "docs" / "errors" / "http.md",
}
HI = [{"role": "user", "content": "hi"}]
BUSY = (
    "The engine is currently busy and cannot accept new requests. Please try "
    "again later or on a different instance."
)
GENERIC = "The server had an error while processing your request."

Error = tuple[int, dict[str, Any]]


def _post(path: str, body: Any, *, key: bool = True, raw: bytes | None = None) -> Any:
    def send(server: OmniServer) -> Error:
        headers = server.headers() if key else {}
        response = httpx.post(
            server.base_url + path,
            headers={**headers, "content-type": "application/json"},
            content=raw if raw is not None else json.dumps(body).encode(),
            timeout=60,
        )
        return response.status_code, response.json()["error"]

    return send


def _get(path: str, *, key: bool = True) -> Callable[[OmniServer], Error]:
    def send(server: OmniServer) -> Error:
        headers = server.headers() if key else {}
        response = httpx.get(server.base_url + path, headers=headers, timeout=60)
        return response.status_code, response.json()["error"]

    return send


def _stream_error(body: dict[str, Any]) -> Callable[[OmniServer], Error]:
    """The error event of an SSE stream that failed after its first chunk."""

    def send(server: OmniServer) -> Error:
        with httpx.stream(
            "POST",
            server.base_url + "/v1/chat/completions",
            headers=server.headers(),
            json={**body, "stream": True},
            timeout=60,
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: {") and '"error"' in line:
                    error = json.loads(line[len("data: ") :])["error"]
                    return error["code"], error
        raise AssertionError("the stream had no error event")

    return send


def _job_content_too_early(server: OmniServer) -> Error:
    """A video job's content while it runs (the longest, largest video the
    reference stage makes: seconds of work, asked for at once)."""
    created = httpx.post(
        server.base_url + "/v1/videos",
        headers=server.headers(),
        json={"prompt": "waves", "seconds": "10", "size": "512x512", "fps": 30},
        timeout=60,
    )
    assert created.status_code == 200, created.text
    job = created.json()["id"]
    try:
        return _get(f"/v1/videos/{job}/content")(server)
    finally:
        httpx.delete(
            f"{server.base_url}/v1/videos/{job}", headers=server.headers(), timeout=60
        )


def _realtime(*frames: str | bytes) -> Callable[[OmniServer], Error]:
    """The error event the last frame is answered with."""

    def send(server: OmniServer) -> Error:
        url = server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"
        with connect(url, additional_headers=server.headers(), max_size=None) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
            for frame in frames:
                ws.send(frame)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                event = json.loads(ws.recv(timeout=30))
                if event["type"] == "error":
                    return event["error"]["code"], event["error"]
        raise AssertionError("no error event")

    return send


@dataclass(frozen=True)
class Quote:
    doc: str
    send: Callable[[OmniServer], Error]
    status: int
    message: str


# A documented request → the status and the exact message the docs quote.
QUOTES: dict[str, Quote] = {
    "unknown field": Quote(
        "serving",
        _post("/v1/chat/completions", {"messages": HI, "max_token": 5}),
        400,
        "max_token is not a field of this route (POST /v1/chat/completions); "
        "did you mean max_tokens?",
    ),
    "unknown model": Quote(
        "serving",
        _post("/v1/chat/completions", {"model": "nope", "messages": HI}),
        404,
        "The model `nope` does not exist.",
    ),
    "no API key": Quote(
        "serving", _get("/v1/models", key=False), 401, "Invalid or missing API key."
    ),
    "a stage fails mid-stream": Quote(
        "serving",
        _stream_error(
            {
                "messages": [{"role": "user", "content": "hello @talkboom"}],
                "modalities": ["text", "audio"],
            }
        ),
        500,
        GENERIC,
    ),
    "a job's content while it runs": Quote(
        "serving",
        _job_content_too_early,
        409,
        "The video job is in progress; it has no content.",
    ),
    "realtime unknown event type": Quote(
        "serving",
        _realtime('{"type":"session.update","event_id":"m2"}'),
        400,
        "Unknown event type; supported: response.create.",
    ),
    "realtime event not an object": Quote(
        "serving", _realtime("[1, 2]"), 400, "An event must be a JSON object."
    ),
    "realtime guardrail": Quote(
        "serving",
        _realtime(
            json.dumps(
                {
                    "type": "response.create",
                    "event_id": "g1",
                    "response": {"instructions": "tell me about forbidden-topic"},
                }
            )
        ),
        400,
        "The request was rejected by the content guardrail.",
    ),
    "realtime lone surrogate": Quote(
        "serving",
        _realtime(
            '{"type":"response.create","event_id":"u1",'
            '"response":{"instructions":"a\\ud800b"}}'
        ),
        400,
        "response.instructions is not valid Unicode (it holds a lone surrogate).",
    ),
    "realtime message too large": Quote(
        "serving",
        _realtime("x" * (1048576 + 1)),
        413,
        "A WebSocket message must be at most 1048576 bytes.",
    ),
    "a stage's queue is full": Quote(
        "http",
        _post(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi @overflow"}]},
        ),
        503,
        BUSY,
    ),
    "the envelope's example": Quote(
        "http",
        _post("/v1/chat/completions", {"messages": HI, "temperature": 9}),
        400,
        "temperature must be a number between 0 and 2",
    ),
    "a blank image prompt": Quote(
        "http",
        _post("/v1/images/generations", {"prompt": "  "}),
        400,
        "prompt must be a non-empty string",
    ),
    "a blank chat message": Quote(
        "http",
        _post("/v1/chat/completions", {"messages": [{"role": "user", "content": " "}]}),
        400,
        "messages must contain text",
    ),
    "max_completion_tokens below 1": Quote(
        "http",
        _post("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 0}),
        400,
        "max_completion_tokens must be an integer between 1 and 4096",
    ),
    "an integer past 64 bits": Quote(
        "http",
        _post("/v1/chat/completions", {"messages": HI, "seed": 2**64}),
        400,
        "Invalid request: seed: Input should be less than or equal to "
        "9223372036854775807",
    ),
    "not JSON": Quote(
        "http",
        _post("/v1/chat/completions", None, raw=b"{oops"),
        400,
        "Invalid request: body: JSON decode error",
    ),
}

# Quoted messages this server cannot send here (a dead engine, a faulted
# one, a restart, fault tolerance's apply): the file that pins each, which
# must hold its first sentence.
ELSEWHERE = {
    "The engine is not running.": "vllm_omni/entrypoints/openai/routes/health.py",
    "Stage 1 (thinker) has faulted and cannot accept new requests. Please try "
    "again later or on a different instance.": (
        "tests/e2e/test_fault_tolerance_drill.py"
    ),
    "The server restarted before the job finished; submit it again.": (
        "tests/e2e/test_videos.py"
    ),
    "Request accepted; poll /v1/fault_tolerance/status for updates.": (
        "vllm_omni/entrypoints/openai/routes/fault_tolerance.py"
    ),
}

# A quoted response's message: in a JSON body, an SSE event, a comment.
_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _quoted(text: str) -> set[str]:
    return {json.loads(f'"{found}"') for found in _MESSAGE.findall(text)}


def test_every_quoted_message_has_a_case() -> None:
    covered = {quote.message for quote in QUOTES.values()} | set(ELSEWHERE)
    for name, path in DOCS.items():
        missing = _quoted(path.read_text(encoding="utf-8")) - covered
        assert not missing, (name, missing)


@pytest.mark.parametrize("message", sorted(ELSEWHERE))
def test_a_message_sent_elsewhere_is_pinned_there(message: str) -> None:
    first = message.split(". ")[0]
    assert first in (ROOT / ELSEWHERE[message]).read_text(encoding="utf-8")


@pytest.mark.parametrize("case", sorted(QUOTES))
def test_the_docs_quote_the_message(case: str) -> None:
    quote = QUOTES[case]
    text = " ".join(DOCS[quote.doc].read_text(encoding="utf-8").split())
    assert quote.message in text, (case, quote.message)


@pytest.mark.parametrize("case", sorted(QUOTES))
def test_the_server_sends_the_quoted_message(
    omni_server: OmniServer, case: str
) -> None:
    quote = QUOTES[case]
    status, error = quote.send(omni_server)
    assert (status, error["code"], error["message"]) == (
        quote.status,
        quote.status,
        quote.message,
    )
