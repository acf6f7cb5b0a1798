"""The image stage decodes client images only under explicit limits (issue 12).

Every undecodable, truncated, oversized or bomb image is a 422 on ``image``
from the header check, before pixels are decoded, whatever Pillow raised.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import pytest
from PIL import Image

from tests.stages.stage_run import run
from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.errors import VLLMUnprocessableEntityError
from vllm_omni.stages.image import (
    DEFAULT_MAX_IMAGE_FRAMES,
    DEFAULT_MAX_IMAGE_PIXELS,
    decode_image,
    probe_image,
)

UNDECODABLE = "The input image could not be decoded."


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = struct.pack(">I", zlib.crc32(kind + data))
    return struct.pack(">I", len(data)) + kind + data + crc


def _png_header(
    width: int, height: int, tail: bytes = b"\x08\x02\x00\x00\x00"
) -> bytes:
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">II", width, height) + tail)
        + _chunk(b"IEND", b"")
    )


def _png(side: int) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((side, side), 64).convert("RGB").save(buffer, "PNG")
    return buffer.getvalue()


def _gif(frames: int) -> bytes:
    images = []
    for index in range(frames):
        image = Image.new("L", (16, 16), 0)
        image.putpixel((index % 16, index // 16 % 16), 255)
        images.append(image)
    buffer = io.BytesIO()
    images[0].save(buffer, "GIF", save_all=True, append_images=images[1:])
    return buffer.getvalue()


CASES: dict[str, tuple[bytes, dict[str, int], str]] = {
    "bomb": (_png_header(30000, 30000), {}, "more than 16777216 pixels"),
    "over_limit": (
        _png_header(200, 200),
        {"max_pixels": 10_000},
        "more than 10000 pixels",
    ),
    "corrupt_ihdr": (_png_header(64, 64, b"\x08\x02\x00\x00"), {}, UNDECODABLE),
    "bad_ppm": (b"P6\n99999999999999999999 7\n255\n", {}, UNDECODABLE),
    "not_an_image": (b"definitely not an image", {}, UNDECODABLE),
    "zero_size_ppm": (b"P6\n0 0\n255\n", {}, UNDECODABLE),
    "truncated": (_png(128)[:2000], {}, UNDECODABLE),
    "frames": (_gif(5), {"max_frames": 4}, "more than 4 frames"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_images_are_422_on_image(name: str) -> None:
    data, limits, message = CASES[name]
    with pytest.raises(VLLMUnprocessableEntityError) as caught:
        decode_image(data, **limits)
    assert caught.value.parameter == "image"
    assert message in str(caught.value)


@pytest.mark.parametrize("name", ["bomb", "over_limit", "frames"])
def test_limits_are_checked_from_the_header(name: str) -> None:
    data, limits, message = CASES[name]
    with pytest.raises(VLLMUnprocessableEntityError) as caught:
        probe_image(data, **limits)
    assert message in str(caught.value)


def test_an_image_within_the_limits_decodes() -> None:
    decoded = decode_image(_png(64), max_pixels=64 * 64, max_frames=1)
    assert decoded.size == (64, 64) and decoded.mode == "RGB"
    probe_image(_gif(4), max_frames=4)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_image_pixels": 100}, "more than 100 pixels"),
        ({"max_image_frames": 2, "image": _gif(3)}, "more than 2 frames"),
    ],
)
async def test_the_stage_applies_the_limits_it_is_given(
    params: dict[str, Any], message: str
) -> None:
    params = {"image": _png(64), "size": "64x64", **params}
    with pytest.raises(VLLMUnprocessableEntityError) as caught:
        await run("image", **params)
    assert caught.value.parameter == "image"
    assert message in str(caught.value)


def test_server_defaults_are_the_stage_defaults() -> None:
    limits = RequestLimits()
    assert limits.max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS
    assert limits.max_image_frames == DEFAULT_MAX_IMAGE_FRAMES
