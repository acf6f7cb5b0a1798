"""The reference speech stages: talker (text → codes) and vocoder (codes → WAV).

Owns the reference voices and validates ``voice`` and ``speed``
(docs/runtime.md §1).
"""

from __future__ import annotations

import io
import wave
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import numpy as np

from vllm_omni.errors import VLLMNotFoundError, VLLMValidationError
from vllm_omni.stages.base import Stage, bounded_float
from vllm_omni.stages.ranges import Choices, Numbers, ParamRange
from vllm_omni.wire.messages import Payload, Submit

__all__ = [
    "DEFAULT_VOICE",
    "SAMPLE_RATE",
    "SPEED_RANGE",
    "VOICES",
    "TalkerStage",
    "VocoderStage",
]

# Voice name → base pitch in Hz.
VOICES: dict[str, float] = {
    "alloy": 180.0,
    "ash": 140.0,
    "ballad": 160.0,
    "coral": 220.0,
    "echo": 120.0,
    "fable": 200.0,
    "nova": 240.0,
    "onyx": 100.0,
    "sage": 190.0,
    "shimmer": 260.0,
}
DEFAULT_VOICE = "alloy"
SPEED_RANGE = (0.25, 4.0)
SAMPLE_RATE = 16_000
MAX_CODES = 4096
_CODE_SECONDS = 0.05


class TalkerStage(Stage):
    """Turns text into pitch codes (0 = silence), shaped by voice and speed."""

    kind: ClassVar[str] = "talker"
    RANGES: ClassVar[Mapping[str, ParamRange]] = {
        "voice": Choices(tuple(sorted(VOICES))),
        "speed": Numbers(*SPEED_RANGE),
    }

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        _voice_and_speed(params)

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        voice, speed = _voice_and_speed(request.params)
        text = request.inputs.text if request.inputs and request.inputs.text else ""
        text = text or request.prompt
        if not text.strip():
            raise VLLMValidationError("input text must not be empty", parameter="input")
        codes = [0 if ch.isspace() else 1 + ord(ch) % 24 for ch in text[:MAX_CODES]]
        yield Payload(tokens=codes, meta={"voice": voice, "speed": speed})


def _voice_and_speed(params: Mapping[str, Any]) -> tuple[str, float]:
    voice = params.get("voice", DEFAULT_VOICE)
    if not isinstance(voice, str) or voice not in VOICES:
        raise VLLMNotFoundError(
            f"Unknown voice. Available voices: {', '.join(sorted(VOICES))}."
        )
    return voice, bounded_float(params, "speed", 1.0, *SPEED_RANGE)


class VocoderStage(Stage):
    """Synthesizes a WAV from the talker's codes: one short tone per code."""

    kind: ClassVar[str] = "vocoder"

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        inputs = request.inputs or Payload()
        if not inputs.tokens:
            raise RuntimeError("vocoder received no codes from the talker")
        base = VOICES.get(str(inputs.meta.get("voice")), VOICES[DEFAULT_VOICE])
        speed = float(inputs.meta.get("speed", 1.0))
        # Synthesis is CPU-bound: the device thread keeps the loop responsive.
        audio = await self.on_device(synthesize, inputs.tokens, base, speed)
        yield Payload(
            audio=audio,
            meta={"sample_rate": SAMPLE_RATE, "format": "wav"},
        )


def synthesize(codes: list[int], base_hz: float, speed: float) -> bytes:
    """16-bit PCM mono WAV: code ``c`` → a tone ``c`` quarter-tones above base."""
    per_code = max(1, int(SAMPLE_RATE * _CODE_SECONDS / speed))
    code_array = np.repeat(np.asarray(codes, dtype=np.float64), per_code)
    freq = np.where(code_array > 0, base_hz * 2.0 ** (code_array / 24.0), 0.0)
    phase = 2.0 * np.pi * np.cumsum(freq) / SAMPLE_RATE
    samples = np.where(code_array > 0, 0.3 * np.sin(phase), 0.0)
    pcm = (samples * 32767.0).astype("<i2").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(pcm)
    return buffer.getvalue()
