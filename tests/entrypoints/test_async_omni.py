"""``AsyncOmni`` on the reference pipeline: what the server relies on."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import pytest
from PIL import Image

from tests.engine.engines import collect, write_pipeline
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.errors import (
    OmniClientError,
    OmniConflictError,
    OmniServiceUnavailableError,
    VLLMClientError,
    VLLMValidationError,
)

pytestmark = pytest.mark.timeout(60)


async def test_engine_describes_the_pipeline(reference_engine: AsyncOmni) -> None:
    assert reference_engine.model_name == "omni-reference"
    assert reference_engine.modalities == {"text", "audio", "image", "video"}
    assert "alloy" in reference_engine.voices
    assert reference_engine.is_running and not reference_engine.errored
    await reference_engine.check_health()


async def test_text_streams_one_output_per_token(reference_engine: AsyncOmni) -> None:
    outputs = await collect(reference_engine, "stream me please", request_id="txt-1")
    *tokens, final = outputs
    assert [o.text_delta for o in tokens] == [
        "You",
        " said:",
        " stream",
        " me",
        " please",
    ]
    assert not any(o.finished for o in tokens)
    assert final.finished and final.text == "You said: stream me please"
    assert final.text_delta == "" and final.finish_reason == "stop"
    assert final.details is None


async def test_text_and_audio(reference_engine: AsyncOmni) -> None:
    outputs = await collect(
        reference_engine,
        "hello",
        request_id="tts-1",
        modalities=["text", "audio"],
        params={"voice": "nova", "max_tokens": 2},
    )
    final = outputs[-1]
    assert final.text == "You said:" and final.finish_reason == "length"
    with wave.open(io.BytesIO(final.audio or b"")) as wav:
        assert wav.getnframes() > 0


async def test_speech_only_and_unknown_voice(reference_engine: AsyncOmni) -> None:
    outputs = await collect(
        reference_engine, "read this", request_id="speech-1", modalities=["audio"]
    )
    assert len(outputs) == 1 and outputs[0].audio and outputs[0].text == ""
    with pytest.raises(OmniClientError) as info:
        await collect(
            reference_engine,
            "x",
            request_id="speech-2",
            modalities="audio",
            params={"voice": "nobody"},
        )
    details = info.value.details
    assert details is not None
    assert (details.status_code, details.error_type, details.stage_id) == (
        404,
        "NotFoundError",
        2,
    )


async def test_images_and_edits(reference_engine: AsyncOmni) -> None:
    outputs = await collect(
        reference_engine,
        "a cat",
        request_id="img-1",
        modalities=["image"],
        params={"size": "64x64", "n": 2, "seed": 3},
    )
    final = outputs[-1]
    assert final.diffusion is not None and final.diffusion.seed == 3
    assert len(final.images) == 2 and final.image == final.images[0]
    with Image.open(io.BytesIO(final.image or b"")) as png:
        assert png.format == "PNG" and png.size == (64, 64)
    edited = await collect(
        reference_engine,
        "make it blue",
        request_id="img-2",
        modalities=["image"],
        params={"image": final.image, "size": "64x64"},
    )
    assert edited[-1].image
    with pytest.raises(VLLMClientError) as info:
        await collect(
            reference_engine,
            "edit",
            request_id="img-3",
            modalities=["image"],
            params={"image": b"not an image"},
        )
    assert info.value.details.status_code == 422  # type: ignore[attr-defined]
    assert info.value.details.parameter == "image"  # type: ignore[attr-defined]
    assert "not an image" not in info.value.details.message  # type: ignore[attr-defined]


async def test_video(reference_engine: AsyncOmni) -> None:
    outputs = await collect(
        reference_engine,
        "waves",
        request_id="vid-1",
        modalities=["video"],
        params={"seconds": 1, "fps": 4},
    )
    final = outputs[-1]
    assert final.video and final.diffusion and final.diffusion.num_frames == 4
    with Image.open(io.BytesIO(final.video)) as gif:
        assert gif.format == "GIF"


async def test_stage_validation_keeps_parameter(reference_engine: AsyncOmni) -> None:
    with pytest.raises(OmniClientError) as info:
        await collect(
            reference_engine, "hi", request_id="val-1", params={"temperature": 3}
        )
    assert isinstance(info.value, VLLMClientError)
    details = info.value.details
    assert details is not None
    assert (details.status_code, details.parameter, details.stage_id) == (
        400,
        "temperature",
        1,
    )
    assert details.request_id == "val-1"


async def test_validation_before_submission_sends_nothing(
    reference_engine: AsyncOmni,
) -> None:
    before = await reference_engine.stage_stats()
    for modalities in (["smell"], [], ["image", "text"]):
        with pytest.raises(VLLMValidationError) as info:
            await collect(
                reference_engine, "x", request_id="pre-1", modalities=modalities
            )
        assert info.value.parameter == "modalities"
    with pytest.raises(VLLMValidationError) as info:
        await collect(
            reference_engine, "x", request_id="pre-2", params={"obj": object()}
        )
    assert info.value.parameter == "obj"  # the offending parameter, by name
    # Text that is not Unicode (a lone surrogate) cannot travel on the stage
    # wire: refused naming it, not a UnicodeEncodeError from the encoder.
    for prompt, params, parameter in (
        ("x \ud800", {}, "prompt"),
        ("x", {"voice": "\udc00"}, "voice"),
        ("x", {"lora": {"name": ["ok", "\udc00\ud800"]}}, "lora.name.1"),
        ("x", {"\ud800": 1}, "params"),
    ):
        with pytest.raises(VLLMValidationError) as info:
            await collect(reference_engine, prompt, request_id="pre-3", params=params)
        assert (info.value.details.status_code, info.value.parameter) == (
            400,
            parameter,
        )
    after = await reference_engine.stage_stats()
    assert [s["submitted"] for s in after.values()] == [
        s["submitted"] for s in before.values()
    ]


async def test_missing_modality_is_503(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path, {"model": "text-only", "stages": [{"id": 0, "kind": "text"}]}
    )
    engine = await AsyncOmni.create(pipeline=path)
    try:
        assert engine.modalities == {"text"} and engine.voices == []
        with pytest.raises(
            OmniServiceUnavailableError, match="pipeline has no audio stage"
        ):
            await collect(engine, "x", request_id="no-audio", modalities=["audio"])
    finally:
        engine.shutdown()
    assert not engine.is_running


async def test_duplicate_request_id_is_a_conflict(reference_engine: AsyncOmni) -> None:
    stream = reference_engine.generate(
        "one", request_id="dup-1", params={"max_tokens": 50}
    )
    await anext(stream)
    with pytest.raises(OmniConflictError):
        await collect(reference_engine, "two", request_id="dup-1")
    await stream.aclose()


async def test_unsafe_request_ids_still_route(reference_engine: AsyncOmni) -> None:
    outputs = await collect(
        reference_engine, "ok", request_id="id with spaces/and slash"
    )
    assert outputs[-1].request_id == "id with spaces/and slash"
    with pytest.raises(OmniClientError) as info:
        await collect(
            reference_engine, "x", request_id="bad id/1", params={"max_tokens": -1}
        )
    assert info.value.details and info.value.details.parameter == "max_tokens"
