"""The headers clients act on (docs/design.md §10), end to end on ``vllm-omni serve``.

- **Retry guidance**: the official OpenAI SDK, with its default retries
  (``max_retries=2``: up to 3 attempts), is pointed at one real route per
  error class. The attempts are counted on the server, in
  ``http_requests_total`` parsed with ``prometheus_client.parser``: 1 where
  the response said ``x-should-retry: false``, 3 where it said ``true`` (and
  then the SDK waited the ``Retry-After`` of 1 s between attempts instead of
  its own shorter backoff). The classes and their decision are the table in
  ``docs/errors/status-mapping.md`` (Retry guidance).
- **Request id**: exactly one ``X-Request-Id`` on every kind of response —
  success, error, SSE, 405, unknown route, ``/health``, ``/metrics``, the
  OpenAPI document, an accepted or denied WebSocket handshake — the client's
  when it sent a safe one, and the suffix of the body's ``id``. (Every other
  e2e test is held to the same by ``conftest.py``.)
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.e2e.omni_server import (
    FAULTS,
    REFERENCE_STAGES,
    OmniServer,
    start_server,
    write_pipeline,
)
from tests.e2e.servers import metric_samples, sample_delta, settled_samples

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")

MODEL = "omni-reference"
CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
IN_FLIGHT = ("vllm_omni:requests_in_flight", ())
# max_retries=2, the SDK's default: one attempt and two retries.
ALL_ATTEMPTS = 3
RETRY_AFTER_S = 1

Call = Callable[[openai.OpenAI], Any]


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 0, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def _chat(prompt: str, **extra: Any) -> Call:
    return lambda c: c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], **extra
    )


def _speech(text: str) -> Call:
    return lambda c: c.audio.speech.create(model=MODEL, voice="alloy", input=text)


# class: (call, handler, status, SDK exception, x-should-retry)
CLASSES: dict[str, tuple[Call, str, int, type[openai.APIStatusError], bool]] = {
    "400 validation": (
        lambda c: c.images.generate(model=MODEL, prompt=" "),
        "/v1/images/generations",
        400,
        openai.BadRequestError,
        False,
    ),
    "404 unknown job": (
        lambda c: c.videos.retrieve("video_00000000000000000000000000000000"),
        "/v1/videos/{video_id}",
        404,
        openai.NotFoundError,
        False,
    ),
    "422 undecodable image": (
        lambda c: c.images.edit(
            model=MODEL, image=("x.png", b"not an image", "image/png"), prompt="p"
        ),
        "/v1/images/edits",
        422,
        openai.UnprocessableEntityError,
        False,
    ),
    "500 nonfatal stage failure": (
        _speech("say it @talkboom"),
        SPEECH,
        500,
        openai.InternalServerError,
        True,
    ),
    "501 not implemented": (
        lambda c: c.videos.remix("video_00000000000000000000000000000000", prompt="x"),
        "/v1/videos/{video_id}/remix",
        501,
        openai.InternalServerError,
        False,
    ),
    "503 drained stage": (
        _chat("please @unavailable"),
        CHAT,
        503,
        openai.InternalServerError,
        True,
    ),
    "504 stage deadline": (
        _chat("please @hang"),
        CHAT,
        504,
        openai.InternalServerError,
        True,
    ),
}


def _sdk(base_url: str, api_key: str | None) -> openai.OpenAI:
    # No max_retries: the SDK's default is what clients run with.
    return openai.OpenAI(base_url=base_url + "/v1", api_key=api_key or "unused")


def _attempts(
    server: OmniServer,
    call: Call,
    handler: str,
    status: int,
    sdk_class: type[openai.APIStatusError],
    retry: bool,
) -> None:
    """Run ``call`` through the SDK; the server must have seen the attempts
    the response's ``x-should-retry`` asked for, each with that status."""
    group = f"{status // 100}xx"
    expected = ALL_ATTEMPTS if retry else 1
    before = metric_samples(server.base_url)
    started = time.monotonic()
    with _sdk(server.base_url, server.api_key) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            call(client)
    elapsed = time.monotonic() - started
    after = settled_samples(
        server.base_url,
        before,
        "http_requests_total",
        expected,
        handler=handler,
        status=group,
    )
    assert (
        sample_delta(before, after, "http_requests_total", handler=handler) == expected
    )
    assert (
        sample_delta(
            before, after, "http_requests_total", handler=handler, status=group
        )
        == expected
    )
    exc = caught.value
    assert type(exc) is sdk_class
    assert exc.status_code == status
    headers = exc.response.headers
    assert headers.get_list("x-should-retry") == [str(retry).lower()]
    assert headers.get_list("retry-after") == ([str(RETRY_AFTER_S)] if retry else [])
    assert headers.get_list("x-request-id") == [exc.body["request_id"]]  # type: ignore[index]
    if retry:
        # The SDK's own backoff would be at most 0.5 s + 1 s.
        assert elapsed >= (ALL_ATTEMPTS - 1) * RETRY_AFTER_S


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CLASSES))
def test_sdk_attempts_per_error_class(omni_server: OmniServer, name: str) -> None:
    _attempts(omni_server, *CLASSES[name])


def _in_flight(server: OmniServer) -> float:
    return metric_samples(server.base_url)[IN_FLIGHT]


@pytest.mark.timeout(60)
def test_sdk_attempts_on_a_conflict(omni_server: OmniServer) -> None:
    """409: a request id that is already in flight (a request hanging in the
    text stage until its deadline) is refused once, not three times."""
    server = omni_server
    request_id = "retry-guidance-409"
    holder: dict[str, httpx.Response] = {}

    def hold() -> None:
        holder["response"] = httpx.post(
            server.base_url + CHAT,
            headers={**server.headers(), "X-Request-Id": request_id},
            json={"model": MODEL, "messages": [{"role": "user", "content": "@hang"}]},
            timeout=30,
        )

    idle = _in_flight(server)
    thread = threading.Thread(target=hold)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while _in_flight(server) < idle + 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _attempts(
            server,
            _chat("again", extra_headers={"X-Request-Id": request_id}),
            CHAT,
            409,
            openai.ConflictError,
            False,
        )
    finally:
        thread.join(timeout=30)
    assert holder["response"].status_code == 504


# autouse: started when the module's first test starts, so that it starts
# while the tests before its own wait (the 504 waits out three deadlines).
@pytest.fixture(scope="module", autouse=True)
def dying_engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OmniServer]:
    """A server kept up after its engine dies (no image or video stage: it
    starts sooner). Started when the module starts, waited for when needed."""
    directory = tmp_path_factory.mktemp("retry-fatal")
    stages = [s for s in REFERENCE_STAGES if s["kind"] not in ("image", "video")]
    kept = {s["id"] for s in stages}
    faults = [f for f in FAULTS if f["stage"] in kept]
    server = start_server(
        directory,
        write_pipeline(directory, stages=stages, faults=faults),
        env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_sdk_attempts_on_a_dead_engine(dying_engine: OmniServer) -> None:
    """500 fatal: the request that sees the vocoder die, and one refused by
    the dead engine afterwards, are each sent once."""
    dying_engine.wait_ready()
    _attempts(
        dying_engine,
        _speech("say it and @die"),
        SPEECH,
        500,
        openai.InternalServerError,
        False,
    )
    _attempts(
        dying_engine,
        _chat("anyone there?"),
        CHAT,
        500,
        openai.InternalServerError,
        False,
    )
    assert dying_engine.proc.poll() is None


# -- the body of an SSE error (after 200) says it too -----------------------------


def test_stream_errors_before_and_after_the_first_byte(
    omni_server: OmniServer,
) -> None:
    base, headers = omni_server.base_url, omni_server.headers()
    request = {"model": MODEL, "stream": True}
    # Before the first byte: an HTTP error with its headers.
    with httpx.stream(
        "POST",
        base + CHAT,
        headers=headers,
        json={**request, "messages": [{"role": "user", "content": "x @unavailable"}]},
        timeout=30,
    ) as refused:
        refused.read()
    assert refused.status_code == 503
    assert refused.headers.get_list("x-should-retry") == ["true"]
    assert refused.headers.get_list("retry-after") == ["1"]
    # After the first chunk: no header can change, the event says it.
    with httpx.stream(
        "POST",
        base + CHAT,
        headers=headers,
        json={
            **request,
            "messages": [{"role": "user", "content": "talk then @talkboom"}],
            "modalities": ["text", "audio"],
        },
        timeout=30,
    ) as started:
        events = [line for line in started.iter_lines() if line.startswith("data: ")]
    assert started.status_code == 200
    assert started.headers.get_list("x-should-retry") == []
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert (error["code"], error["stage_id"], error["retryable"]) == (500, 2, True)
    assert events[-1] == "data: [DONE]"


# -- X-Request-Id on every kind of response ---------------------------------------


def _one_id(response: httpx.Response) -> str:
    values = response.headers.get_list("x-request-id")
    assert len(values) == 1, (response.request.url, values)
    return values[0]


def test_every_kind_of_response_has_one_request_id(omni_server: OmniServer) -> None:
    base, auth = omni_server.base_url, omni_server.headers()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
        responses = {
            "chat": http.post(CHAT, json=chat),
            "completion": http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hello"}
            ),
            "models": http.get("/v1/models"),
            "voices": http.get("/v1/audio/voices"),
            "speech": http.post(SPEECH, json={"input": "hi", "voice": "alloy"}),
            "health": http.get("/health"),
            "metrics": http.get("/metrics"),
            "openapi": http.get("/openapi.json"),
            "docs": http.get("/docs"),
            "unknown route": http.get("/v1/nope"),
            "405": http.get(CHAT),
            "400": http.post(CHAT, json={**chat, "messages": []}),
            "401": httpx.get(base + "/v1/models"),
        }
        with http.stream("POST", CHAT, json={**chat, "stream": True}) as sse:
            frames = [line for line in sse.iter_lines() if line]
        responses["sse"] = sse
    statuses = {name: response.status_code for name, response in responses.items()}
    assert statuses == {
        "chat": 200,
        "completion": 200,
        "models": 200,
        "voices": 200,
        "speech": 200,
        "health": 200,
        "metrics": 200,
        "openapi": 200,
        "docs": 200,
        "unknown route": 404,
        "405": 405,
        "400": 400,
        "401": 401,
        "sse": 200,
    }
    ids = {name: _one_id(response) for name, response in responses.items()}
    # A fresh id each (32 hex digits), and an error's is its body's.
    assert len(set(ids.values())) == len(ids)
    for name, response in responses.items():
        if response.status_code >= 400:
            assert response.json()["error"]["request_id"] == ids[name], name
    # The body's id names the request: chatcmpl-<X-Request-Id>.
    assert responses["chat"].json()["id"] == f"chatcmpl-{ids['chat']}"
    assert responses["completion"].json()["id"] == f"cmpl-{ids['completion']}"
    first = json.loads(frames[0].removeprefix("data: "))
    assert first["id"] == f"chatcmpl-{ids['sse']}"
    assert frames[-1] == "data: [DONE]"


def test_the_clients_request_id_names_a_success(omni_server: OmniServer) -> None:
    base, auth = omni_server.base_url, omni_server.headers()
    sent = {**auth, "X-Request-Id": "client-chose-this-1"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    ok = httpx.post(base + CHAT, headers=sent, json=chat, timeout=30)
    assert ok.status_code == 200
    assert _one_id(ok) == "client-chose-this-1"
    assert ok.json()["id"] == "chatcmpl-client-chose-this-1"
    models = httpx.get(base + "/v1/models", headers=sent)
    assert _one_id(models) == "client-chose-this-1"
    # An unsafe id is replaced, on a success as on an error.
    hostile = httpx.get(
        base + "/v1/models", headers={**auth, "X-Request-Id": "../../etc; rm -rf /"}
    )
    replaced = _one_id(hostile)
    assert len(replaced) == 32 and "etc" not in replaced


def test_websocket_handshakes_have_one_request_id(omni_server: OmniServer) -> None:
    ws_base = omni_server.base_url.replace("http://", "ws://", 1)
    sent = {**omni_server.headers(), "X-Request-Id": "ws-handshake-1"}
    with connect(ws_base + "/v1/realtime", additional_headers=sent) as ws:
        assert ws.response is not None
        assert ws.response.headers.get_all("x-request-id") == ["ws-handshake-1"]
        created = json.loads(ws.recv(timeout=10))
        assert created["session"]["id"] == "ws-handshake-1"
    with pytest.raises(InvalidStatus) as denied:
        connect(ws_base + "/v1/nope", additional_headers=sent)
    response = denied.value.response
    assert response.status_code == 404
    assert response.headers.get_all("x-request-id") == ["ws-handshake-1"]
    assert response.headers.get_all("x-should-retry") == ["false"]
