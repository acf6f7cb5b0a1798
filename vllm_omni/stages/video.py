"""The reference video stage: a short animated GIF from prompt and seed.

Validates ``seconds``, ``size``, ``fps`` and ``seed``, and encodes off the
event loop (docs/runtime.md §1).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from PIL import Image

from vllm_omni.stages.base import Stage, bounded_float, bounded_int, parse_size
from vllm_omni.stages.image import SEED_RANGE, gradient, seed_for
from vllm_omni.stages.ranges import Integers, Numbers, ParamRange, Sizes
from vllm_omni.wire.messages import Payload, Submit

__all__ = ["FPS_RANGE", "SECONDS_RANGE", "SIZE_RANGE", "VideoStage"]

SECONDS_RANGE = (0.1, 10.0)
SIZE_RANGE = (64, 512)
FPS_RANGE = (1, 30)


class VideoStage(Stage):
    """Text-to-video as an animated GIF."""

    kind: ClassVar[str] = "video"
    RANGES: ClassVar[Mapping[str, ParamRange]] = {
        "seconds": Numbers(*SECONDS_RANGE),
        "size": Sizes(*SIZE_RANGE),
        "fps": Integers(*FPS_RANGE),
        "seed": Integers(*SEED_RANGE),
    }

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        _settings(params)
        seed_for("", params)

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        params = request.params
        seconds, width, height, fps = _settings(params)
        seed = seed_for(request.prompt, params)
        count = max(1, round(seconds * fps))
        video = await self.on_device(_encode_gif, width, height, fps, seed, count)
        yield Payload(
            video=video,
            meta={
                "width": width,
                "height": height,
                "fps": fps,
                "num_frames": count,
                "seed": seed,
            },
        )


def _settings(params: Mapping[str, Any]) -> tuple[float, int, int, int]:
    """Seconds, width, height and fps, each checked."""
    seconds = bounded_float(params, "seconds", 1.0, *SECONDS_RANGE)
    width, height = parse_size(params, "128x128", *SIZE_RANGE)
    return seconds, width, height, bounded_int(params, "fps", 8, *FPS_RANGE) or 8


def _encode_gif(width: int, height: int, fps: int, seed: int, count: int) -> bytes:
    """Draw and encode the frames (CPU-bound: runs in a worker thread)."""
    frames = [
        Image.fromarray(gradient(width, height, seed, index / count))
        for index in range(count)
    ]
    buffer = io.BytesIO()
    frames[0].save(
        buffer,
        format="GIF",
        save_all=True,
        append_images=frames[1:],
        duration=max(1, round(1000 / fps)),
        loop=0,
    )
    return buffer.getvalue()
