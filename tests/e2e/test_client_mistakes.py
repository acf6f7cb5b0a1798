"""Client mistakes are never 5xx (issue 12), against real ``vllm-omni serve``.

Two real servers: the shared ``omni_server`` (strict mode, an API key, the
default limits) and, for this module, a legacy-mode server started with small
explicit limits (``--max-request-bytes`` … ``--max-image-frames``), the way
an operator sets them. Every case asserts the exact status, ``error.type``,
``param`` and message, the ``X-Request-Id`` (and ``Allow``) headers, and the
samples the response added to ``/metrics``.
"""

from __future__ import annotations

import io
import json
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.e2e.canonical import assert_canonical_error
from tests.e2e.omni_server import OmniServer, start_server, write_pipeline
from tests.e2e.servers import (
    assert_http_error_counted,
    metric_samples,
    sample_delta,
    settled_samples,
)

ERRORS = "vllm_omni:errors_total"
LIMITS = {
    "max_request_bytes": 200_000,
    "max_prompt_chars": 1000,
    "max_image_bytes": 50_000,
    "max_image_pixels": 1_000_000,
    "max_image_frames": 4,
}
DEFAULT_PIXELS = 4096 * 4096
DEFAULT_FRAMES = 64
EDITS = "/v1/images/edits"
CHAT = "/v1/chat/completions"
GENERATIONS = "/v1/images/generations"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    """Legacy mode, no API key, the image stage only, small explicit limits."""
    directory = tmp_path_factory.mktemp("limited-server")
    pipeline = write_pipeline(
        directory,
        stages=[{"id": 0, "name": "image", "kind": "image", "timeout_s": 30}],
        faults=[],
        blocklist=(),
    )
    args: tuple[str, ...] = ()
    for name, value in LIMITS.items():
        args += ("--" + name.replace("_", "-"), str(value))
    server = start_server(directory, pipeline, error_mode="legacy", extra_args=args)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["strict", "legacy"])
def server(
    request: pytest.FixtureRequest, omni_server: OmniServer
) -> Iterator[OmniServer]:
    yield (
        omni_server if request.param == "strict" else request.getfixturevalue("limited")
    )


def _limit(server: OmniServer, name: str, default: int) -> int:
    return default if server.api_key else LIMITS[name]


def _expect(
    server: OmniServer,
    send: Callable[[], httpx.Response],
    *,
    handler: str,
    status: int,
    error_type: str,
    param: str | None,
    message: str | None = None,
    stage_id: int | None = None,
) -> httpx.Response:
    """``send`` once; assert the canonical error and the metrics it added."""
    before = metric_samples(server.base_url)
    response = send()
    after = settled_samples(
        server.base_url, before, "http_requests_total", 1, handler=handler
    )
    body = response.json()
    assert_canonical_error(response.status_code, body, response.headers)
    error = body["error"]
    assert response.status_code == status, body
    assert (error["type"], error["param"]) == (error_type, param), body
    assert error.get("stage_id") == stage_id, body
    assert error["request_id"] == response.headers["x-request-id"]
    if message is not None:
        assert error["message"] == message
    assert_http_error_counted(
        before, after, handler=handler, status=status, error_type=error_type
    )
    return response


# -- media: decoded under explicit limits, 422 on the field ---------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = struct.pack(">I", zlib.crc32(kind + data))
    return struct.pack(">I", len(data)) + kind + data + crc


def _png_header(
    width: int, height: int, ihdr_tail: bytes = b"\x08\x02\x00\x00\x00"
) -> bytes:
    ihdr = struct.pack(">II", width, height) + ihdr_tail
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(b""))
        + _chunk(b"IEND", b"")
    )


def _real_png(side: int = 256) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((side, side), 64).convert("RGB").save(buffer, "PNG")
    return buffer.getvalue()


def _gif(frames: int) -> bytes:
    # One lit pixel moving frame to frame: no two frames equal, none merged.
    images = []
    for index in range(frames):
        image = Image.new("L", (16, 16), 0)
        image.putpixel((index % 16, index // 16 % 16), 255)
        images.append(image)
    buffer = io.BytesIO()
    images[0].save(buffer, "GIF", save_all=True, append_images=images[1:])
    return buffer.getvalue()


UNDECODABLE = "The input image could not be decoded."


def _pixels_message(limit: int) -> str:
    return f"The input image has more than {limit} pixels."


# name: (image bytes, expected message given the pixel and frame limits, stage)
IMAGES: dict[str, tuple[bytes, Callable[[int, int], str], int | None]] = {
    # 65 bytes whose header claims 30000x30000: Pillow's DecompressionBombError.
    "bomb_header": (_png_header(30000, 30000), lambda px, _: _pixels_message(px), None),
    # 5000x5000 is under Pillow's own bomb limit but over ours.
    "over_pixel_limit": (
        _png_header(5000, 5000),
        lambda px, _: _pixels_message(px),
        None,
    ),
    # IHDR of 12 bytes instead of 13: Pillow's "Truncated IHDR chunk" ValueError.
    "corrupt_ihdr": (
        _png_header(64, 64, b"\x08\x02\x00\x00"),
        lambda _, __: UNDECODABLE,
        None,
    ),
    "bad_ppm_header": (
        b"P6\n99999999999999999999 7\n255\n",
        lambda _, __: UNDECODABLE,
        None,
    ),
    "not_an_image": (b"GIF89a but not really", lambda _, __: UNDECODABLE, None),
    "too_many_frames": (
        _gif(DEFAULT_FRAMES + 1),
        lambda _, frames: f"The input image has more than {frames} frames.",
        None,
    ),
    # A valid header over truncated pixel data: only decoding finds out, in
    # the image stage, which answers with the same 422.
    "truncated_pixels": (_real_png()[:3000], lambda _, __: UNDECODABLE, 0),
}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_bad_images_are_422_on_image(server: OmniServer, name: str) -> None:
    data, message, stage = IMAGES[name]
    pixels = _limit(server, "max_image_pixels", DEFAULT_PIXELS)
    frames = _limit(server, "max_image_frames", DEFAULT_FRAMES)
    # The image stage is stage 4 of the shared pipeline, 0 of the limited one.
    stage_id = None if stage is None else (4 if server.api_key else 0)
    _expect(
        server,
        lambda: httpx.post(
            server.base_url + EDITS,
            headers=server.headers(),
            files={"image": ("x.png", data, "image/png")},
            data={"prompt": "make it blue"},
            timeout=60,
        ),
        handler=EDITS,
        status=422,
        error_type="UnprocessableEntityError",
        param="image",
        message=message(pixels, frames),
        stage_id=stage_id,
    )


def test_image_over_the_byte_limit_is_422(limited: OmniServer) -> None:
    limit = LIMITS["max_image_bytes"]
    _expect(
        limited,
        lambda: httpx.post(
            limited.base_url + EDITS,
            files={"image": ("x.png", b"\x89PNG" + b"\0" * limit, "image/png")},
            data={"prompt": "p"},
            timeout=60,
        ),
        handler=EDITS,
        status=422,
        error_type="UnprocessableEntityError",
        param="image",
        message=f"The input image must be at most {limit} bytes.",
    )


def test_an_image_within_the_limits_is_edited(limited: OmniServer) -> None:
    response = httpx.post(
        limited.base_url + EDITS,
        files={"image": ("x.png", _real_png(64), "image/png")},
        data={"prompt": "p", "size": "64x64"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 1


# -- request size and prompt limits ---------------------------------------------


def test_body_over_the_default_limit_is_413(omni_server: OmniServer) -> None:
    prompt = "x" * (32 * 1024 * 1024)
    body = json.dumps({"messages": [{"role": "user", "content": prompt}]})
    _expect(
        omni_server,
        lambda: httpx.post(
            omni_server.base_url + CHAT,
            headers={**omni_server.headers(), "content-type": "application/json"},
            content=body,
            timeout=60,
        ),
        handler=CHAT,
        status=413,
        error_type="RequestTooLargeError",
        param=None,
        message="The request body must be at most 20971520 bytes.",
    )


def test_chunked_body_is_cut_off_while_reading(limited: OmniServer) -> None:
    limit = LIMITS["max_request_bytes"]

    def chunks() -> Iterator[bytes]:
        # No Content-Length: only counting while reading can refuse this.
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"y" * 16_384
        yield b'"}]}'

    _expect(
        limited,
        lambda: httpx.post(
            limited.base_url + CHAT,
            headers={"content-type": "application/json"},
            content=chunks(),
            timeout=60,
        ),
        handler=CHAT,
        status=413,
        error_type="RequestTooLargeError",
        param=None,
        message=f"The request body must be at most {limit} bytes.",
    )


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "z" * 1001}]}, "messages"),
        (GENERATIONS, {"prompt": "z" * 1001}, "prompt"),
    ],
)
def test_prompt_over_the_limit_is_400(
    limited: OmniServer, path: str, payload: dict[str, Any], param: str
) -> None:
    _expect(
        limited,
        lambda: httpx.post(limited.base_url + path, json=payload, timeout=60),
        handler=path,
        status=400,
        error_type="BadRequestError",
        param=param,
        message=f"{param} must be at most 1000 characters",
    )


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"messages": [{"role": "wizard", "content": "hi"}]},
            "messages.0.role",
            "role must be one of system, developer, user, assistant, tool, function",
        ),
        (
            {"n": 2, "modalities": ["text", "audio"]},
            "n",
            "n > 1 is not supported with audio output",
        ),
        ({"voice": "nova"}, "voice", 'voice needs "audio" in modalities'),
        (
            {"modalities": ["text", "audio"], "voice": "nova", "speaker": "nova"},
            "speaker",
            "speaker cannot be honoured: the voice is given once (here also as voice)",
        ),
        ({"prompt": ["a", "b"]}, "prompt", "prompt must be a string"),
    ],
    ids=["role", "n_with_audio", "voice_without_audio", "voice_twice", "prompts"],
)
def test_the_request_alone_is_checked_before_the_model(
    omni_server: OmniServer, fields: dict[str, Any], param: str, message: str
) -> None:
    """What the request alone decides is checked on its model, before the
    route looks at ``model`` (as upstream's pydantic checks come first): a
    mistake there is its 400 even with an unknown model."""
    path = "/v1/completions" if "prompt" in fields else CHAT
    payload = {"model": "no-such-model", **fields}
    if path == CHAT:
        payload.setdefault("messages", [{"role": "user", "content": "hi"}])
    _expect(
        omni_server,
        lambda: httpx.post(
            omni_server.base_url + path,
            headers=omni_server.headers(),
            json=payload,
            timeout=60,
        ),
        handler=path,
        status=400,
        error_type="BadRequestError",
        param=param,
        message=message,
    )


def test_empty_image_prompt_is_400(omni_server: OmniServer) -> None:
    _expect(
        omni_server,
        lambda: httpx.post(
            omni_server.base_url + GENERATIONS,
            headers=omni_server.headers(),
            json={"prompt": ""},
            timeout=60,
        ),
        handler=GENERATIONS,
        status=400,
        error_type="BadRequestError",
        param="prompt",
        message="prompt must be a non-empty string",
    )


def test_blank_edit_prompt_is_400(omni_server: OmniServer) -> None:
    _expect(
        omni_server,
        lambda: httpx.post(
            omni_server.base_url + EDITS,
            headers=omni_server.headers(),
            files={"image": ("x.png", _real_png(64), "image/png")},
            data={"prompt": "   "},
            timeout=60,
        ),
        handler=EDITS,
        status=400,
        error_type="BadRequestError",
        param="prompt",
        message="prompt must be a non-empty string",
    )


# -- authentication before the body --------------------------------------------

BROKEN_MULTIPART = (
    b'--xyz\r\nContent-Disposition: form-data; name="image"; filename="a.png"'
    b"\r\n\r\n\x89PNG...no closing boundary"
)


@pytest.mark.parametrize(
    ("path", "content_type", "body"),
    [
        (CHAT, "application/json", b'{"messages": [ not json'),
        (EDITS, "multipart/form-data; boundary=xyz", BROKEN_MULTIPART),
        (CHAT, "application/json", b"x" * (32 * 1024 * 1024)),
    ],
    ids=["malformed-json", "broken-multipart", "over-the-size-limit"],
)
def test_unauthenticated_is_401_whatever_the_body(
    omni_server: OmniServer, path: str, content_type: str, body: bytes
) -> None:
    _expect(
        omni_server,
        lambda: httpx.post(
            omni_server.base_url + path,
            headers={"content-type": content_type},
            content=body,
            timeout=60,
        ),
        handler=path,
        status=401,
        error_type="AuthenticationError",
        param=None,
        message="Invalid or missing API key.",
    )


def test_authenticated_malformed_json_is_still_400(omni_server: OmniServer) -> None:
    _expect(
        omni_server,
        lambda: httpx.post(
            omni_server.base_url + CHAT,
            headers={**omni_server.headers(), "content-type": "application/json"},
            content=b'{"messages": [ not json',
            timeout=60,
        ),
        handler=CHAT,
        status=400,
        error_type="BadRequestError",
        param="body",
        message="Invalid request: body: JSON decode error",
    )


# -- WebSocket handshakes to routes that are not WebSockets ---------------------


@pytest.mark.parametrize("path", ["/v1/nope", "/v1/models", "/v1/realtime/x"])
def test_websocket_to_a_non_websocket_route_is_404(
    omni_server: OmniServer, path: str
) -> None:
    url = omni_server.base_url.replace("http://", "ws://", 1) + path
    before = metric_samples(omni_server.base_url)
    with pytest.raises(InvalidStatus) as caught:
        connect(
            url,
            additional_headers={**omni_server.headers(), "X-Request-Id": "ws-probe-12"},
        )
    response = caught.value.response
    assert response.status_code == 404
    assert response.headers["x-request-id"] == "ws-probe-12"
    assert json.loads(response.body) == {
        "error": {
            "message": "Not Found",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
            "request_id": "ws-probe-12",
        }
    }
    after = metric_samples(omni_server.base_url)
    labels = {"transport": "websocket", "category": "client"}
    assert (
        sample_delta(before, after, ERRORS, type="NotFoundError", code="404", **labels)
        == 1
    )


# -- 405 carries Allow -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "handler", "allow"),
    [
        ("DELETE", "/v1/models", "/v1/models", "GET"),
        ("GET", CHAT, CHAT, "POST"),
        ("PUT", "/v1/videos/video_1", "/v1/videos/{video_id}", "DELETE, GET"),
        ("GET", EDITS, EDITS, "POST"),
    ],
)
def test_405_carries_allow(
    omni_server: OmniServer, method: str, path: str, handler: str, allow: str
) -> None:
    response = _expect(
        omni_server,
        lambda: httpx.request(
            method, omni_server.base_url + path, headers=omni_server.headers()
        ),
        handler=handler,
        status=405,
        error_type="MethodNotAllowedError",
        param=None,
        message="Method Not Allowed",
    )
    assert response.headers["allow"] == allow


# -- parameter rules: exact param and wording ------------------------------------


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {"max_completion_tokens": 0, "max_tokens": 5},
            "max_completion_tokens",
            "max_completion_tokens must be an integer between 1 and 4096",
        ),
        (
            {"max_completion_tokens": -1},
            "max_completion_tokens",
            "max_completion_tokens must be an integer between 1 and 4096",
        ),
        (
            {"max_tokens": 0},
            "max_tokens",
            "max_tokens must be an integer between 1 and 4096",
        ),
        (
            {"max_completion_tokens": 2**70},
            "max_completion_tokens",
            "max_completion_tokens must be a plain value: a string, a 64-bit "
            "integer, a number, a bool, bytes, or lists and mappings of them",
        ),
        (
            {"seed": -(2**70)},
            "seed",
            "Invalid request: seed: Input should be greater than or equal to "
            "-9223372036854775808",
        ),
        (
            # Upstream's model reads "yes" as true; the reference stage has no
            # EOS to ignore, so the field is refused rather than dropped.
            {"extra_body": {"ignore_eos": "yes"}},
            "ignore_eos",
            "ignore_eos cannot be honoured: it is not supported by stage 1 (thinker).",
        ),
    ],
)
def test_token_and_seed_rules_name_the_field(
    omni_server: OmniServer, extra: dict[str, Any], param: str, message: str
) -> None:
    client = openai.OpenAI(
        base_url=omni_server.base_url + "/v1",
        api_key=omni_server.api_key,
        max_retries=0,
    )
    before = metric_samples(omni_server.base_url)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="omni-reference",
            messages=[{"role": "user", "content": "hi"}],
            **extra,
        )
    after = settled_samples(
        omni_server.base_url, before, "http_requests_total", 1, handler=CHAT
    )
    body = caught.value.body
    assert isinstance(body, dict)
    assert (body["code"], body["type"], body["param"]) == (
        400,
        "BadRequestError",
        param,
    )
    assert body["message"] == message
    assert body["request_id"] == caught.value.response.headers["x-request-id"]
    assert_http_error_counted(
        before, after, handler=CHAT, status=400, error_type="BadRequestError"
    )


# -- the client's X-Request-Id on job content ------------------------------------


def test_failed_job_content_answers_with_the_clients_request_id(
    omni_server: OmniServer,
) -> None:
    headers = omni_server.headers()
    created = httpx.post(
        omni_server.base_url + "/v1/videos",
        headers=headers,
        json={"prompt": "please @vleak", "seconds": "1", "size": "64x64"},
        timeout=60,
    )
    assert created.status_code == 200, created.text
    video_id = created.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        job = httpx.get(
            f"{omni_server.base_url}/v1/videos/{video_id}", headers=headers
        ).json()
        if job["status"] == "failed" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    stored = job["error"]
    assert stored["request_id"] == video_id  # the job id stays in the job body

    response = _expect(
        omni_server,
        lambda: httpx.get(
            f"{omni_server.base_url}/v1/videos/{video_id}/content",
            headers={**headers, "X-Request-Id": "client-req-12"},
        ),
        handler="/v1/videos/{video_id}/content",
        status=stored["code"],
        error_type=stored["type"],
        param=stored["param"],
        message=stored["message"],
        stage_id=stored.get("stage_id"),
    )
    assert response.headers["x-request-id"] == "client-req-12"
    # The stored error as an HTTP error: its retry guidance is the header
    # (false: a repeat reads the same record), not the stored ``retryable``.
    assert response.json()["error"] == {
        **{k: v for k, v in stored.items() if k != "retryable"},
        "request_id": "client-req-12",
    }
    assert stored["retryable"] is False
    assert response.headers["x-should-retry"] == "false"
