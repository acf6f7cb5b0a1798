"""``WS /v1/realtime`` end to end: the shared ``vllm-omni serve`` (API key,
fault markers, guardrail), a real ``websockets`` client, real metrics.

What is pinned (docs/design.md §4, WebSocket): a denied handshake carries the
canonical status and body (401 wrong key, 503 no text stage) and the retry
guidance headers; a text and a text+audio response stream; a malformed event
gets one error event with its ``event_id`` and the session goes on; a failed
response sends one error event, whose ``retryable`` is the retry guidance,
and closes 1011 (server) or 1008 (client); a client that leaves mid-response
aborts the request and is not counted as an error.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import threading
import time
import wave
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.e2e.omni_server import REFERENCE_STAGES, OmniServer
from tests.e2e.servers import (
    metric_samples,
    sample_delta,
    serve_in_thread,
    settled_samples,
)
from vllm_omni.config import StageConfig
from vllm_omni.outputs import OmniRequestOutput

GENERIC = "The server had an error while processing your request."
ERRORS = "vllm_omni:errors_total"
TEXT_TIMEOUT_S = next(s["timeout_s"] for s in REFERENCE_STAGES if s["kind"] == "text")


# A client that hangs up mid-stream connects with ``max_queue=None``: it keeps
# reading until the server answers its close frame. With the default queue
# (16 messages) the sync client stops reading once 16 deltas wait unread, so
# it never sees the server's answer and drops the socket only when its
# ``close_timeout`` (10 s) is over: each such test took 10 s more.


def _url(base_url: str) -> str:
    return base_url.replace("http://", "ws://", 1) + "/v1/realtime"


@pytest.fixture()
def session(omni_server: OmniServer) -> Iterator[tuple[ClientConnection, str]]:
    """An open session and its id (from ``session.created``)."""
    with connect(
        _url(omni_server.base_url), additional_headers=omni_server.headers()
    ) as ws:
        created = _recv(ws)
        assert created["type"] == "session.created"
        yield ws, created["session"]["id"]


def _recv(ws: ClientConnection) -> dict[str, Any]:
    event = json.loads(ws.recv(timeout=10))
    assert isinstance(event, dict)
    return event


def _create(ws: ClientConnection, event_id: str | None = None, **response: Any) -> None:
    event: dict[str, Any] = {"type": "response.create", "response": response}
    if event_id is not None:
        event["event_id"] = event_id
    ws.send(json.dumps(event))


def _until_done(ws: ClientConnection) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(_recv(ws))
        if events[-1]["type"] in ("response.done", "error"):
            return events


def _closed_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as caught:
        ws.recv(timeout=10)
    return caught.value.rcvd.code if caught.value.rcvd else None


# -- responses ---------------------------------------------------------------------


def test_text_session_runs_several_responses(
    session: tuple[ClientConnection, str],
) -> None:
    ws, _ = session
    for prompt in ("hello realtime", "and again"):
        _create(ws, "t1", instructions=prompt, max_tokens=16)
        events = _until_done(ws)
        kinds = [e["type"] for e in events]
        assert kinds[0] == "response.created"
        assert kinds[-2:] == ["response.text.done", "response.done"]
        deltas = "".join(
            e["delta"] for e in events if e["type"] == "response.text.delta"
        )
        assert deltas == f"You said: {prompt}"
        assert events[-2]["text"] == deltas
        done = events[-1]["response"]
        assert (done["status"], done["finish_reason"]) == ("completed", "stop")
        assert done["id"] == events[0]["response"]["id"]


def test_text_and_audio(session: tuple[ClientConnection, str]) -> None:
    ws, _ = session
    _create(ws, instructions="speak to me", modalities=["text", "audio"])
    events = _until_done(ws)
    assert events[-1]["type"] == "response.done"
    audio = [e["delta"] for e in events if e["type"] == "response.audio.delta"]
    assert len(audio) == 1
    with wave.open(io.BytesIO(base64.b64decode(audio[0]))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        assert wav.getnframes() > 0
    assert "response.audio.done" in [e["type"] for e in events]


# -- malformed events: one error event each, the session goes on --------------------

# name: (frame, echoed event_id, param)
MALFORMED: dict[str, tuple[str, str | None, str | None]] = {
    "not json": ("{oops", None, None),
    "not an object": ("[1, 2]", None, None),
    "no type": ('{"event_id": "m1"}', "m1", "type"),
    "unknown type": ('{"type": "session.update", "event_id": "m2"}', "m2", "type"),
    "no response": ('{"type": "response.create", "event_id": "m3"}', "m3", "response"),
    "no instructions": (
        '{"type": "response.create", "event_id": "m4", "response": {}}',
        "m4",
        "response.instructions",
    ),
    "bad modalities": (
        '{"type": "response.create", "event_id": "m5",'
        ' "response": {"instructions": "x", "modalities": ["video"]}}',
        "m5",
        "response.modalities",
    ),
    "max_tokens type": (
        '{"type": "response.create", "event_id": "m6",'
        ' "response": {"instructions": "x", "max_tokens": "5"}}',
        "m6",
        "response.max_tokens",
    ),
    "max_tokens past 64 bits": (
        '{"type": "response.create", "event_id": "m8",'
        ' "response": {"instructions": "x", "max_tokens": 1' + "0" * 30 + "}}",
        "m8",
        "response.max_tokens",
    ),
    "nested too deep": ("[" * 100_000, None, None),
    "temperature type": (
        '{"type": "response.create", "event_id": "m7",'
        ' "response": {"instructions": "x", "temperature": true}}',
        "m7",
        "response.temperature",
    ),
    "bad event_id": ('{"type": "response.create", "event_id": 5}', None, "event_id"),
}


def test_malformed_events_then_a_valid_one(
    omni_server: OmniServer, session: tuple[ClientConnection, str]
) -> None:
    ws, session_id = session
    before = metric_samples(omni_server.base_url)
    for name, (frame, event_id, param) in MALFORMED.items():
        ws.send(frame)
        event = _recv(ws)
        assert event["type"] == "error", name
        assert event.get("event_id") == event_id, name
        assert event["error"] == {
            "message": event["error"]["message"],
            "type": "BadRequestError",
            "param": param,
            "code": 400,
            "request_id": session_id,
            "retryable": False,
        }, name
    ws.send(b"binary frame")
    assert _recv(ws)["error"]["code"] == 400
    after = metric_samples(omni_server.base_url)
    assert (
        sample_delta(before, after, ERRORS, transport="websocket", code="400")
        == len(MALFORMED) + 1
    )

    _create(ws, "ok", instructions="still here")
    assert _until_done(ws)[-1]["response"]["status"] == "completed"


# -- failed responses: one error event, then close ------------------------------------


def test_stage_failure_closes_1011(session: tuple[ClientConnection, str]) -> None:
    ws, session_id = session
    _create(ws, "f1", instructions="explode @boom")
    events = _until_done(ws)
    assert [e["type"] for e in events] == ["response.created", "error"]
    assert events[-1]["event_id"] == "f1"
    assert events[-1]["error"] == {
        "message": GENERIC,
        "type": "InternalServerError",
        "param": None,
        "code": 500,
        "request_id": session_id,
        "stage_id": 1,
        "error_stage_id": 1,
        "retryable": True,
    }
    assert _closed_code(ws) == 1011


def test_guardrail_closes_1008(session: tuple[ClientConnection, str]) -> None:
    ws, _ = session
    _create(ws, "g1", instructions="tell me about forbidden-topic")
    error = _until_done(ws)[-1]
    assert error["type"] == "error" and error["event_id"] == "g1"
    assert (error["error"]["type"], error["error"]["code"]) == (
        "GuardrailViolationError",
        400,
    )
    assert error["error"]["stage_id"] == 0
    assert error["error"]["retryable"] is False
    assert "forbidden-topic" not in error["error"]["message"]
    assert _closed_code(ws) == 1008


def test_unavailable_closes_1013(session: tuple[ClientConnection, str]) -> None:
    ws, _ = session
    _create(ws, "u1", instructions="busy @unavailable")
    error = _until_done(ws)[-1]
    assert error["event_id"] == "u1"
    assert (error["error"]["type"], error["error"]["code"]) == (
        "ServiceUnavailableError",
        503,
    )
    assert error["error"]["retryable"] is True
    assert _closed_code(ws) == 1013


def test_stage_parameter_rejection_closes_1008(
    session: tuple[ClientConnection, str],
) -> None:
    ws, _ = session
    _create(ws, "p1", instructions="x", max_tokens=100_000)
    error = _until_done(ws)[-1]["error"]
    assert (error["code"], error["param"], error["stage_id"]) == (400, "max_tokens", 1)
    assert error["retryable"] is False
    assert _closed_code(ws) == 1008


# -- handshake denials ----------------------------------------------------------------


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer wrong"}, {}])
def test_wrong_api_key_denies_the_handshake(
    omni_server: OmniServer, headers: dict[str, str]
) -> None:
    with pytest.raises(InvalidStatus) as caught:
        connect(_url(omni_server.base_url), additional_headers=headers)
    response = caught.value.response
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body) == {
        "error": {
            "message": "Invalid or missing API key.",
            "type": "AuthenticationError",
            "param": None,
            "code": 401,
            "request_id": response.headers["x-request-id"],
        }
    }
    assert response.headers["x-should-retry"] == "false"


def test_pipeline_without_text_stage_denies_503() -> None:
    """In process, on a stand-in engine that has no text stage."""
    from vllm_omni.entrypoints.openai.api_server import build_app

    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    app.state.engine_client = _VideoOnlyEngine()
    with serve_in_thread(app) as url, pytest.raises(InvalidStatus) as caught:
        connect(_url(url))
    response = caught.value.response
    assert response.status_code == 503
    error = json.loads(response.body)["error"]
    assert (error["type"], error["code"]) == ("ServiceUnavailableError", 503)
    assert response.headers["x-should-retry"] == "true"
    assert response.headers["retry-after"] == "1"


class _VideoOnlyEngine:
    model_name = "omni-reference"
    modalities = frozenset({"video"})
    errored = False
    is_running = True

    async def check_health(self) -> None:
        return None


# -- client disconnect -------------------------------------------------------------


def test_hang_up_mid_stream_is_a_client_disconnect(omni_server: OmniServer) -> None:
    """After the first text delta of a long answer: one abort in every stage
    of the route, counted as ``client_disconnect`` (never ``cancelled``), and
    no error."""
    before = metric_samples(omni_server.base_url)
    with connect(
        _url(omni_server.base_url),
        additional_headers=omni_server.headers(),
        max_queue=None,  # keeps reading until the close is answered
    ) as ws:
        session_id = _recv(ws)["session"]["id"]
        _create(ws, instructions="a very long answer " * 300, max_tokens=4096)
        assert _recv(ws)["type"] == "response.created"
        assert _recv(ws)["type"] == "response.text.delta"
    omni_server.wait_for_log(
        *(
            f"stage {stage}: request {re.escape(session_id)} aborted"
            for stage in (0, 1)
        ),
        within_s=5,
    )
    after = metric_samples(omni_server.base_url)
    aborts = {
        reason: sample_delta(before, after, "vllm_omni:aborts_total", reason=reason)
        for reason in ("client_disconnect", "cancelled", "abort", "timeout")
    }
    assert aborts == {"client_disconnect": 1, "cancelled": 0, "abort": 0, "timeout": 0}
    assert sample_delta(before, after, ERRORS) == 0


class _AheadEngine:
    """Stands in for an engine whose whole answer is already waiting (a loaded
    API server behind fast stages): every output is ready at once."""

    model_name = "omni-reference"
    modalities = frozenset({"text"})
    errored = False
    is_running = True
    OUTPUTS = 20_000

    def __init__(self) -> None:
        self.yielded = 0
        self.closed = threading.Event()

    async def check_health(self) -> None:
        return None

    def stage_for(self, modality: str) -> StageConfig | None:
        return StageConfig(1, "thinker", "text") if modality == "text" else None

    async def generate(
        self,
        prompt: str,
        *,
        request_id: str,
        modalities: Any,
        params: Any,
        sampling_params_list: Any = None,
        trace_headers: Any = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        try:
            for _ in range(self.OUTPUTS):
                self.yielded += 1
                yield OmniRequestOutput(request_id=request_id, text_delta="w ")
            yield OmniRequestOutput(
                request_id=request_id, finished=True, finish_reason="stop"
            )
        finally:
            self.closed.set()


def test_hang_up_is_heard_while_the_engine_is_ahead() -> None:
    """Sends to a client that keeps reading never wait: the session must still
    give its reader a turn, or it streams the whole answer to a client that
    left (under load, most cut sessions were never aborted)."""
    from vllm_omni.entrypoints.openai.api_server import build_app

    engine = _AheadEngine()
    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    app.state.engine_client = engine
    with serve_in_thread(app) as url:
        with connect(_url(url), max_queue=None) as ws:  # reads until closed
            _recv(ws)
            _create(ws, instructions="hi")
            assert _recv(ws)["type"] == "response.created"
            assert _recv(ws)["type"] == "response.text.delta"
        assert engine.closed.wait(10)
    assert engine.yielded < _AheadEngine.OUTPUTS


def test_disconnect_mid_response_aborts_and_is_not_an_error(
    omni_server: OmniServer,
) -> None:
    """The text stage hangs on ``@hang``; a request that was not aborted would
    hit the stage deadline and render a 504 error event (counted, logged)."""
    before = metric_samples(omni_server.base_url)
    with connect(
        _url(omni_server.base_url), additional_headers=omni_server.headers()
    ) as ws:
        session_id = _recv(ws)["session"]["id"]
        _create(ws, instructions="wait for it @hang")
        assert _recv(ws)["type"] == "response.created"
    time.sleep(TEXT_TIMEOUT_S + 1.0)

    after = metric_samples(omni_server.base_url)
    assert sample_delta(before, after, ERRORS, transport="websocket") == 0
    assert (
        sample_delta(
            before, after, "vllm_omni:aborts_total", reason="client_disconnect"
        )
        == 1
    )
    # The stages log the abort (INFO); nothing else mentions the request.
    mentions = [line for line in omni_server.log().splitlines() if session_id in line]
    assert mentions, "the stages never logged the abort"
    assert all(
        line.endswith(("aborted", "(running work cancelled)")) for line in mentions
    )
    for stage in (0, 1):  # the route's stages: guardrail, text
        assert any(
            f"stage {stage}: request {session_id} aborted" in m for m in mentions
        )
    assert httpx.get(omni_server.base_url + "/health").status_code == 200
    with connect(
        _url(omni_server.base_url), additional_headers=omni_server.headers()
    ) as ws:
        _recv(ws)
        _create(ws, instructions="next session")
        assert _until_done(ws)[-1]["type"] == "response.done"


@pytest.mark.parametrize(
    ("response", "param"),
    [
        ({"tools": [{"type": "function", "name": "f"}]}, "response.tools"),
        ({"voice": "nova"}, "response.voice"),  # no audio: no talker
        ({"output_audio_format": "pcm16"}, "response.output_audio_format"),
        ({"max_response_output_tokens": 5}, "response.max_response_output_tokens"),
    ],
)
def test_a_response_field_no_stage_honours_is_refused(
    session: tuple[ClientConnection, str], response: dict[str, Any], param: str
) -> None:
    ws, _ = session
    _create(ws, "f1", instructions="hello", **response)
    error = _recv(ws)
    assert error["type"] == "error" and error["event_id"] == "f1"
    assert (error["error"]["code"], error["error"]["param"]) == (400, param)
    # The session goes on: the same request without the field is served.
    _create(ws, "f2", instructions="hello")
    events = _until_done(ws)
    assert events[-1]["type"] == "response.done"


# -- message size limit ------------------------------------------------------------


def _padded(size: int, event_id: str) -> str:
    """An event (of an unknown type) of exactly ``size`` bytes."""
    event = {"type": "pad", "event_id": event_id, "pad": ""}
    frame = json.dumps(event)
    return json.dumps({**event, "pad": "x" * (size - len(frame))})


def _assert_too_big(ws: ClientConnection, limit: int) -> None:
    """One 413 error event, then the close with 1009 (message too big)."""
    event = _recv(ws)
    assert event["type"] == "error" and "event_id" not in event
    error = event["error"]
    assert (error["code"], error["type"], error["param"]) == (
        413,
        "RequestTooLargeError",
        None,
    )
    assert error["message"] == f"A WebSocket message must be at most {limit} bytes."
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_message_over_the_limit_is_413_then_1009() -> None:
    """``--max-ws-message-bytes`` as an operator sets it (in process): a
    message of exactly the limit is read (here: a 400 for its type), one byte
    more gets the 413 event and the close, counted as a client error."""
    from vllm_omni.entrypoints.openai.api_server import build_app

    limit = 4096
    app = build_app(
        argparse.Namespace(
            api_key=None, error_mode="strict", max_ws_message_bytes=limit
        )
    )
    app.state.engine_client = _AheadEngine()
    with serve_in_thread(app) as url:
        before = metric_samples(url)
        with connect(_url(url)) as ws:
            _recv(ws)
            ws.send(_padded(limit, "fits"))
            fits = _recv(ws)
            assert (fits["event_id"], fits["error"]["code"]) == ("fits", 400)
            ws.send(_padded(limit + 1, "over"))
            _assert_too_big(ws, limit)
        after = settled_samples(
            url, before, ERRORS, 1, transport="websocket", code="413"
        )
    assert (
        sample_delta(
            before,
            after,
            ERRORS,
            transport="websocket",
            category="client",
            type="RequestTooLargeError",
            code="413",
        )
        == 1
    )
    assert sample_delta(before, after, ERRORS, category="server") == 0


def test_default_message_limit(omni_server: OmniServer) -> None:
    """The default, 1 MiB, on the real server: one byte over it is refused."""
    limit = 1024 * 1024
    with connect(
        _url(omni_server.base_url), additional_headers=omni_server.headers()
    ) as ws:
        _recv(ws)
        ws.send(_padded(limit + 1, "over"))
        _assert_too_big(ws, limit)
