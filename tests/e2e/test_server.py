"""``vllm-omni serve`` end to end: a real server process, the OpenAI SDK as
client, Prometheus text parsed with ``prometheus_client.parser``.

Every error a route can raise is produced through that route; the SDK must
raise the exception class of the status, with the canonical error object as
``.body``, and both ``http_requests_total`` and ``vllm_omni:errors_total``
must move by exactly one in the right series.
"""

from __future__ import annotations

import base64
import io
import threading
import time
import wave
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.e2e.omni_server import OmniServer
from tests.e2e.servers import (
    assert_http_error_counted,
    metric_samples,
    sample_delta,
    settled_samples,
)

GENERIC = "The server had an error while processing your request."
MODEL = "omni-reference"
CHAT = "/v1/chat/completions"


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


def _wav_frames(data: bytes) -> int:
    with wave.open(io.BytesIO(data)) as wav:
        assert wav.getsampwidth() == 2
        assert wav.getnchannels() == 1
        return wav.getnframes()


# -- successes ------------------------------------------------------------------


def test_chat_text(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=8
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "You said: hello there"
    # The reference stages count words as tokens (a vllm stage reports the
    # engine's counts instead: tests/real_engine/test_http.py).
    assert completion.usage is not None
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (2, 4, 6)


def test_chat_text_and_audio(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "say something"}],
        modalities=["text", "audio"],
        audio={"voice": "nova", "format": "wav"},
    )
    audio = completion.choices[0].message.audio
    assert audio is not None
    assert _wav_frames(base64.b64decode(audio.data)) > 0


def test_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        max_tokens=6,
    )
    deltas = [chunk.choices[0].delta.content or "" for chunk in stream]
    assert "".join(deltas).startswith("You said:")


@pytest.mark.timeout(60)
def test_chat_stream_opens_before_a_late_talker(client: openai.OpenAI) -> None:
    """A streamed text-and-audio answer whose text is empty (a ``stop`` string
    at its start, or an engine's end-of-text first) opens with the role chunk
    as soon as the text stage is done, as ``vllm serve``'s stream does: the
    client learns the stream started while the talker still runs (here it
    hangs, so nothing else comes within the client's timeout)."""
    stream = client.with_options(timeout=5).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "quiet @talkhang"}],
        modalities=["text", "audio"],
        stop=["You"],
        stream=True,
    )
    with stream:
        first = next(iter(stream))
    assert [c.delta.role for c in first.choices] == ["assistant"]
    assert first.choices[0].delta.content is None
    assert first.choices[0].finish_reason is None


def test_speech(client: openai.OpenAI) -> None:
    speech = client.audio.speech.create(
        model=MODEL, voice="alloy", input="hello world", response_format="wav"
    )
    assert _wav_frames(speech.content) > 0


def test_voices_and_models(omni_server: OmniServer, client: openai.OpenAI) -> None:
    voices = httpx.get(
        omni_server.base_url + "/v1/audio/voices", headers=omni_server.headers()
    )
    assert voices.status_code == 200
    assert "alloy" in voices.json()["voices"]
    assert [m.id for m in client.models.list()] == [MODEL]


def test_images_generate_and_edit(client: openai.OpenAI) -> None:
    generated = client.images.generate(model=MODEL, prompt="a red fox", size="256x256")
    image = Image.open(io.BytesIO(base64.b64decode(generated.data[0].b64_json or "")))
    assert image.format == "PNG" and image.size == (256, 256)

    edited = client.images.edit(
        model=MODEL, image=("in.png", _png(), "image/png"), prompt="bluer"
    )
    image = Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json or "")))
    assert image.format == "PNG"


# -- every error a route can raise ------------------------------------------------

Call = Callable[[openai.OpenAI], Any]


def _chat(prompt: str, **extra: Any) -> Call:
    return lambda c: c.chat.completions.create(
        model=extra.pop("model", MODEL),
        messages=[{"role": "user", "content": prompt}],
        **extra,
    )


# name: (call, handler, SDK class, status, type, param, stage_id, message or None)
ERRORS: dict[
    str, tuple[Call, str, type[Exception], int, str, str | None, int | None, str | None]
] = {
    "validation": (
        _chat("hi", temperature=9),
        CHAT,
        openai.BadRequestError,
        400,
        "BadRequestError",
        "temperature",
        1,
        None,
    ),
    "request_schema": (
        lambda c: c.chat.completions.create(model=MODEL, messages=[]),
        CHAT,
        openai.BadRequestError,
        400,
        "BadRequestError",
        "messages",
        None,
        None,
    ),
    "huge_int": (
        _chat("hi", seed=10**30),
        CHAT,
        openai.BadRequestError,
        400,
        "BadRequestError",
        "seed",
        None,
        None,
    ),
    "unknown_model": (
        _chat("hi", model="nope"),
        CHAT,
        openai.NotFoundError,
        404,
        "NotFoundError",
        "model",
        None,
        "The model `nope` does not exist.",
    ),
    "guardrail": (
        _chat("tell me about forbidden-topic"),
        CHAT,
        openai.BadRequestError,
        400,
        "GuardrailViolationError",
        None,
        0,
        None,
    ),
    "unknown_voice": (
        lambda c: c.audio.speech.create(model=MODEL, voice="nobody", input="x"),
        "/v1/audio/speech",
        openai.NotFoundError,
        404,
        "NotFoundError",
        None,
        2,
        None,
    ),
    "undecodable_image": (
        lambda c: c.images.edit(
            model=MODEL, image=("x.png", b"not an image", "image/png"), prompt="p"
        ),
        "/v1/images/edits",
        openai.UnprocessableEntityError,
        422,
        "UnprocessableEntityError",
        "image",
        None,  # refused by the server's header probe, before the image stage
        "The input image could not be decoded.",
    ),
    "bad_size": (
        lambda c: c.images.generate(model=MODEL, prompt="p", size="13x13"),  # type: ignore[arg-type]
        "/v1/images/generations",
        openai.BadRequestError,
        400,
        "BadRequestError",
        "size",
        4,
        None,
    ),
    "stage_raise": (
        _chat("please @boom"),
        CHAT,
        openai.InternalServerError,
        500,
        "InternalServerError",
        None,
        1,
        GENERIC,
    ),
    "generation_error": (
        _chat("please @generation"),
        CHAT,
        openai.InternalServerError,
        500,
        "InternalServerError",
        None,
        1,
        "KV cache load failed",
    ),
    "retryable": (
        _chat("please @retryable"),
        CHAT,
        openai.InternalServerError,
        503,
        "ServiceUnavailableError",
        None,
        1,
        None,
    ),
    "queue_overflow": (
        _chat("please @overflow"),
        CHAT,
        openai.InternalServerError,
        503,
        "Service Unavailable",
        None,
        1,
        None,
    ),
    "stage_unavailable": (
        _chat("please @unavailable"),
        CHAT,
        openai.InternalServerError,
        503,
        "ServiceUnavailableError",
        None,
        1,
        "talker pool drained",
    ),
    "secret_leak": (
        _chat("please @secret"),
        CHAT,
        openai.InternalServerError,
        500,
        "InternalServerError",
        None,
        1,
        GENERIC,
    ),
}


def _assert_error(
    server: OmniServer,
    call: Call,
    client: openai.OpenAI,
    handler: str,
    sdk_class: type[Exception],
    status: int,
    error_type: str,
    param: str | None,
    stage_id: int | None,
    message: str | None,
) -> dict[str, Any]:
    before = metric_samples(server.base_url)
    with pytest.raises(openai.APIStatusError) as caught:
        call(client)
    after = settled_samples(
        server.base_url, before, "http_requests_total", 1, handler=handler
    )
    exc = caught.value
    assert type(exc) is sdk_class
    assert exc.status_code == status
    body = exc.body
    assert isinstance(body, dict)
    assert body["code"] == status
    assert body["type"] == error_type
    assert body["param"] == param
    assert body.get("stage_id") == stage_id
    assert body.get("error_stage_id") == stage_id  # 0.30's name (issue 22)
    assert body["request_id"] == exc.response.headers["x-request-id"]
    if message is not None:
        assert body["message"] == message
    assert_http_error_counted(
        before, after, handler=handler, status=status, error_type=error_type
    )
    return body


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_route_errors(
    omni_server: OmniServer, client: openai.OpenAI, name: str
) -> None:
    body = _assert_error(omni_server, ERRORS[name][0], client, *ERRORS[name][1:])
    if name == "secret_leak":
        text = str(body)
        for secret in ("/home/alice", "hf_SECRET", "abc.def", "token"):
            assert secret not in text


def test_wrong_api_key_is_401(omni_server: OmniServer) -> None:
    wrong = openai.OpenAI(
        base_url=omni_server.base_url + "/v1", api_key="wrong", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.models.list()
    assert caught.value.status_code == 401
    assert caught.value.body["type"] == "AuthenticationError"  # type: ignore[index]
    assert caught.value.body["code"] == 401  # type: ignore[index]
    missing = httpx.get(omni_server.base_url + "/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == 401


@pytest.mark.timeout(60)
def test_stage_deadline_and_duplicate_request_id(
    omni_server: OmniServer, client: openai.OpenAI
) -> None:
    """A hanging stage answers 504 within its deadline (3 s) plus 1 s; while
    it hangs, a second request with the same id is a 409 conflict."""
    results: dict[str, Any] = {}

    def hang() -> None:
        started = time.monotonic()
        try:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "please @hang"}],
                extra_headers={"X-Request-Id": "dup-req-1"},
            )
        except openai.APIStatusError as exc:
            results["hang"] = exc
        results["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=hang)
    thread.start()
    time.sleep(0.7)
    with pytest.raises(openai.ConflictError) as conflict:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "again"}],
            extra_headers={"X-Request-Id": "dup-req-1"},
        )
    assert conflict.value.body["code"] == 409  # type: ignore[index]
    assert conflict.value.body["type"] == "ConflictError"  # type: ignore[index]
    thread.join(timeout=30)
    timeout_exc = results["hang"]
    assert timeout_exc.status_code == 504
    assert timeout_exc.body["type"] == "GatewayTimeoutError"
    assert timeout_exc.body["stage_id"] == 1
    assert results["elapsed"] < 3 + 1 + 0.5
    # The stage is free for the next request.
    ok = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still there?"}]
    )
    assert ok.choices[0].message.content


# -- SSE --------------------------------------------------------------------------


def test_stream_validation_error_is_http_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            temperature=9,
        )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "temperature"  # type: ignore[index]


def test_stream_fault_after_first_chunk_is_one_error_event(
    omni_server: OmniServer, client: openai.OpenAI
) -> None:
    before = metric_samples(omni_server.base_url)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "talk then @talkboom"}],
        modalities=["text", "audio"],
        stream=True,
    )
    chunks = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            chunks.append(chunk)
    assert chunks, "the stream must have started before the fault"
    body = caught.value.body
    assert body == {
        "message": GENERIC,
        "type": "InternalServerError",
        "param": None,
        "code": 500,
        "request_id": body["request_id"],  # type: ignore[index]
        "stage_id": 2,
        "error_stage_id": 2,
        # After the 200's headers, the event carries the retry guidance.
        "retryable": True,
    }
    after = settled_samples(
        omni_server.base_url, before, "http_requests_total", 1, handler=CHAT
    )
    assert (
        sample_delta(before, after, "http_requests_total", handler=CHAT, status="2xx")
        == 1
    )
    assert (
        sample_delta(
            before,
            after,
            "vllm_omni:errors_total",
            transport="sse",
            category="server",
            type="InternalServerError",
            code="500",
        )
        == 1
    )
    assert sample_delta(before, after, "vllm_omni:errors_total", transport="http") == 0


def test_raw_sse_frames(omni_server: OmniServer) -> None:
    """Exactly one error event, then [DONE], then the stream closes."""
    with httpx.stream(
        "POST",
        omni_server.base_url + CHAT,
        headers=omni_server.headers(),
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "talk @talkboom"}],
            "modalities": ["text", "audio"],
            "stream": True,
        },
        timeout=30,
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    errors = [e for e in events if e.startswith('data: {"error"')]
    assert len(errors) == 1
    assert events[-1] == "data: [DONE]"
    assert events[-2] == errors[0]


@pytest.mark.timeout(60)
def test_client_cut_stream_aborts_in_the_stages(omni_server: OmniServer) -> None:
    """A client that hangs up mid-stream: the text stage's running work is
    cancelled, nothing is written to the dead socket, and no error is counted."""
    before = metric_samples(omni_server.base_url)
    with httpx.stream(
        "POST",
        omni_server.base_url + CHAT,
        headers={**omni_server.headers(), "X-Request-Id": "cut-stream-1"},
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "a very long answer " * 200}],
            "max_tokens": 4096,
            "stream": True,
        },
        timeout=30,
    ) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    # Every stage of the route (guardrail 0, text 1) hears the abort; whether
    # its work was still running then is a race, so it is not asserted.
    omni_server.wait_for_log(
        *(f"stage {stage}: request cut-stream-1 aborted" for stage in (0, 1)),
        within_s=10,
    )
    assert "socket.send() raised exception" not in omni_server.log()
    after = metric_samples(omni_server.base_url)
    assert sample_delta(before, after, "vllm_omni:errors_total") == 0
    assert (
        sample_delta(
            before, after, "vllm_omni:aborts_total", reason="client_disconnect"
        )
        == 1
    )


def test_every_route_but_health_and_metrics_needs_the_key(
    omni_server: OmniServer,
) -> None:
    """docs/serving.md, "API keys": every HTTP route of the served document,
    and the document and its pages, answer 401 without the key."""
    base = omni_server.base_url
    document = httpx.get(base + "/openapi.json", headers=omni_server.headers())
    assert document.status_code == 200
    routes = [
        (method.upper(), path.replace("{", "").replace("}", ""))
        for path, operations in document.json()["paths"].items()
        for method in operations
    ]
    routes += [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")]
    assert len(routes) > 10
    for method, path in routes:
        answer = httpx.request(method, base + path)
        if path in ("/health", "/metrics"):
            assert answer.status_code != 401, path
            continue
        assert answer.status_code == 401, (method, path, answer.status_code)
        assert answer.json()["error"]["type"] == "AuthenticationError"
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/metrics").status_code == 200
