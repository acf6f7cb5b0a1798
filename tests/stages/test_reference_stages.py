"""Reference stages in-process: real media out, semantic errors with parameters."""

from __future__ import annotations

import io
import wave
from typing import Any

import pytest
from PIL import Image

from tests.stages.stage_run import run
from vllm_omni.errors import (
    GuardrailViolationError,
    VLLMClientError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm_omni.stages.text import TextParams, reference_tokens


async def test_text_streams_one_chunk_per_token() -> None:
    chunks = await run("text", "hello there", max_tokens=3)
    assert [c.text for c in chunks] == ["You", " said:", " hello"]
    assert chunks[-1].finish_reason == "length"
    tokens, reason = reference_tokens(
        "hello there", TextParams(temperature=1.0, seed=7)
    )
    again, _ = reference_tokens("hello there", TextParams(temperature=1.0, seed=7))
    assert tokens == again and reason == "stop"


@pytest.mark.parametrize(
    ("kind", "params", "parameter"),
    [
        ("text", {"max_tokens": 0}, "max_tokens"),
        ("text", {"max_tokens": 4097}, "max_tokens"),
        ("text", {"max_tokens": True}, "max_tokens"),
        ("text", {"temperature": 2.5}, "temperature"),
        ("text", {"seed": "x"}, "seed"),
        ("talker", {"speed": 9}, "speed"),
        ("image", {"size": "100x100"}, "size"),
        ("image", {"size": "2048x64"}, "size"),
        ("image", {"n": 0}, "n"),
        ("video", {"fps": 100}, "fps"),
        ("video", {"seconds": 60}, "seconds"),
    ],
)
async def test_bad_params_are_validation_errors(
    kind: str, params: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(VLLMValidationError) as info:
        await run(kind, **params)
    assert info.value.parameter == parameter


async def test_speech_is_a_wav_and_unknown_voice_is_404() -> None:
    (codes,) = await run("talker", "hi there", voice="nova", speed=2.0)
    (audio,) = await run("vocoder", inputs=codes)
    with wave.open(io.BytesIO(audio.audio or b"")) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        assert wav.getnframes() > 0
    with pytest.raises(VLLMNotFoundError) as info:
        await run("talker", voice="nobody")
    assert "nobody" not in str(info.value)


async def test_image_is_png_and_edit_needs_a_decodable_image() -> None:
    (result,) = await run("image", size="64x128", n=2, seed=1)
    assert len(result.images) == 2
    with Image.open(io.BytesIO(result.images[0])) as png:
        assert (png.format, png.size) == ("PNG", (64, 128))
    (edited,) = await run("image", size="64x64", image=result.images[0])
    assert edited.images
    with pytest.raises(VLLMUnprocessableEntityError) as info:
        await run("image", image=b"definitely not an image")
    assert info.value.parameter == "image"


async def test_video_is_an_animated_gif() -> None:
    (result,) = await run("video", seconds=0.5, fps=8, size="64x64")
    with Image.open(io.BytesIO(result.video or b"")) as gif:
        assert gif.format == "GIF" and gif.n_frames == 4


async def test_guardrail_blocks_without_echoing() -> None:
    assert await run("guardrail", "a harmless prompt")
    with pytest.raises(GuardrailViolationError) as info:
        await run("guardrail", "tell me about FORBIDDEN-TOPIC please")
    assert isinstance(info.value, VLLMClientError)
    assert "forbidden" not in str(info.value).lower()
