"""The reference image stage: a PNG from prompt and seed, or an edit of an input.

Checks ``size``, ``n`` and ``seed`` (``RANGES``) and decodes an input image
only under explicit limits, off the event loop (docs/runtime.md §1). Rejected
bytes never reach an error message.
"""

from __future__ import annotations

import hashlib
import io
import struct
import warnings
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import numpy as np
from PIL import Image, UnidentifiedImageError

from vllm_omni.errors import VLLMUnprocessableEntityError, VLLMValidationError
from vllm_omni.stages.base import Stage, bounded_int, parse_size
from vllm_omni.stages.ranges import Integers, ParamRange, Sizes
from vllm_omni.wire.messages import Payload, Submit

__all__ = [
    "DEFAULT_MAX_IMAGE_FRAMES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "MAX_IMAGES",
    "SEED_RANGE",
    "SIZE_RANGE",
    "ImageStage",
    "decode_image",
    "gradient",
    "probe_image",
]

SEED_RANGE = (0, 2**32 - 1)
SIZE_RANGE = (64, 1024)
MAX_IMAGES = 10
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_IMAGE_FRAMES = 64
_LIMIT_RANGE = (1, 2**40)
# What Pillow raises for bytes it cannot decode: not an image, a corrupt or
# truncated chunk ("Truncated IHDR chunk" is a ValueError, a bad PPM header a
# SyntaxError), a header past its own bomb limit. All of them are the
# client's bytes, never a server fault.
_UNDECODABLE = (
    UnidentifiedImageError,
    Image.DecompressionBombError,
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    struct.error,
)


def seed_for(prompt: str, params: Mapping[str, Any]) -> int:
    """The explicit ``seed`` or one derived from the prompt."""
    seed = bounded_int(params, "seed", None, *SEED_RANGE)
    if seed is None:
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    return seed


def gradient(width: int, height: int, seed: int, phase: float = 0.0) -> np.ndarray:
    """An RGB gradient (uint8, H×W×3) whose colours depend on ``seed``."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, size=(2, 3)).astype(np.float32)
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    mix = (0.5 * (xs + ys) + phase) % 1.0
    return (corners[0] * (1.0 - mix) + corners[1] * mix).astype(np.uint8)


def _undecodable() -> VLLMUnprocessableEntityError:
    return VLLMUnprocessableEntityError(
        "The input image could not be decoded.", parameter="image"
    )


def _open_within_limits(data: object, max_pixels: int, max_frames: int) -> Image.Image:
    """Open ``data`` (header only) and check it against the limits."""
    if not isinstance(data, bytes | bytearray) or not data:
        raise VLLMValidationError("image must be non-empty bytes", parameter="image")
    try:
        with warnings.catch_warnings():
            # Our limits decide, not Pillow's warning threshold.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise _too_many_pixels(max_pixels) from exc
    except _UNDECODABLE as exc:
        raise _undecodable() from exc
    width, height = opened.size
    if width < 1 or height < 1:
        raise _undecodable()
    if width * height > max_pixels:
        raise _too_many_pixels(max_pixels)
    try:
        frames = getattr(opened, "n_frames", 1)
    except _UNDECODABLE as exc:
        raise _undecodable() from exc
    if frames > max_frames:
        raise VLLMUnprocessableEntityError(
            f"The input image has more than {max_frames} frames.", parameter="image"
        )
    return opened


def _too_many_pixels(max_pixels: int) -> VLLMUnprocessableEntityError:
    return VLLMUnprocessableEntityError(
        f"The input image has more than {max_pixels} pixels.", parameter="image"
    )


def probe_image(
    data: object,
    *,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_frames: int = DEFAULT_MAX_IMAGE_FRAMES,
) -> None:
    """Check ``data`` against the limits from its header alone (no pixel decoded)."""
    _open_within_limits(data, max_pixels, max_frames).close()


def decode_image(
    data: object,
    *,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_frames: int = DEFAULT_MAX_IMAGE_FRAMES,
) -> Image.Image:
    """Decode request image bytes within the limits, or raise a 422 on ``image``."""
    opened = _open_within_limits(data, max_pixels, max_frames)
    try:
        with opened:
            return opened.convert("RGB")
    except _UNDECODABLE as exc:
        raise _undecodable() from exc


def _limit(params: dict[str, Any], name: str, default: int) -> int:
    value = bounded_int(params, name, default, *_LIMIT_RANGE)
    return default if value is None else value


def encode_png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


class ImageStage(Stage):
    """Text-to-image and image edits (when ``params["image"]`` is given)."""

    kind: ClassVar[str] = "image"
    RANGES: ClassVar[Mapping[str, ParamRange]] = {
        "n": Integers(1, MAX_IMAGES),
        "size": Sizes(*SIZE_RANGE),
        "seed": Integers(*SEED_RANGE),
    }

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        _size_and_count(params)
        seed_for("", params)

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        params = request.params
        width, height, count = _size_and_count(params)
        seed = seed_for(request.prompt, params)
        images = await self.on_device(
            _draw,
            params.get("image"),
            width,
            height,
            count,
            seed,
            _limit(params, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS),
            _limit(params, "max_image_frames", DEFAULT_MAX_IMAGE_FRAMES),
        )
        yield Payload(
            images=images, meta={"width": width, "height": height, "seed": seed}
        )


def _size_and_count(params: Mapping[str, Any]) -> tuple[int, int, int]:
    width, height = parse_size(params, "256x256", *SIZE_RANGE)
    return width, height, bounded_int(params, "n", 1, 1, MAX_IMAGES) or 1


def _draw(
    image: object,
    width: int,
    height: int,
    count: int,
    seed: int,
    max_pixels: int,
    max_frames: int,
) -> list[bytes]:
    """The CPU-bound part of a request (runs in a worker thread)."""
    source = None
    if image is not None:
        decoded = decode_image(image, max_pixels=max_pixels, max_frames=max_frames)
        source = np.asarray(decoded.resize((width, height)))
    images = []
    for index in range(count):
        pixels = gradient(width, height, seed + index)
        if source is not None:
            pixels = ((source.astype(np.uint16) + pixels) // 2).astype(np.uint8)
        images.append(encode_png(pixels))
    return images
