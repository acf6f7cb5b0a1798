"""The reference image stage: a PNG from prompt and seed, or an edit of an input.

Owns the validation of ``size`` ("WxH", 64..1024 each, multiple of 8), ``n``
and ``seed``, and of the input ``image`` of an edit: bytes that do not decode
are ``VLLMUnprocessableEntityError(parameter="image")`` (422). Pictures are
smooth gradients whose colours derive from prompt and seed, encoded by
Pillow. Decoding, drawing and encoding run in a worker thread, off the stage
process's event loop, so heartbeats and aborts are answered on time while a
heavy request (ten 1024x1024 pictures) is being drawn. The rejected bytes
never reach an error message.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import numpy as np
from PIL import Image, UnidentifiedImageError

from vllm_omni.engine.messages import Payload, Submit
from vllm_omni.errors import VLLMUnprocessableEntityError, VLLMValidationError
from vllm_omni.stages.base import Stage, bounded_int, parse_size

__all__ = ["ImageStage", "decode_image", "gradient"]

_SEED_RANGE = (0, 2**32 - 1)


def seed_for(prompt: str, params: dict[str, Any]) -> int:
    """The explicit ``seed`` or one derived from the prompt."""
    seed = bounded_int(params, "seed", None, *_SEED_RANGE)
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


def decode_image(data: object) -> Image.Image:
    """Decode request image bytes, or raise a 422 on ``image``."""
    if not isinstance(data, bytes | bytearray) or not data:
        raise VLLMValidationError("image must be non-empty bytes", parameter="image")
    try:
        with Image.open(io.BytesIO(data)) as opened:
            return opened.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise VLLMUnprocessableEntityError(
            "The input image could not be decoded.", parameter="image"
        ) from exc


def encode_png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


class ImageStage(Stage):
    """Text-to-image and image edits (when ``params["image"]`` is given)."""

    kind: ClassVar[str] = "image"

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        params = request.params
        width, height = parse_size(params, "256x256", 64, 1024)
        count = bounded_int(params, "n", 1, 1, 10) or 1
        seed = seed_for(request.prompt, params)
        images = await asyncio.to_thread(
            _draw, params.get("image"), width, height, count, seed
        )
        yield Payload(
            images=images, meta={"width": width, "height": height, "seed": seed}
        )


def _draw(image: object, width: int, height: int, count: int, seed: int) -> list[bytes]:
    """The CPU-bound part of a request (runs in a worker thread)."""
    source = None
    if image is not None:
        source = np.asarray(decode_image(image).resize((width, height)))
    images = []
    for index in range(count):
        pixels = gradient(width, height, seed + index)
        if source is not None:
            pixels = ((source.astype(np.uint16) + pixels) // 2).astype(np.uint8)
        images.append(encode_png(pixels))
    return images
