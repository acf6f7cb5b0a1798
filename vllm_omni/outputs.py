"""What a caller gets back: ``OmniRequestOutput`` and ``DiffusionOutput``.

Owns the result objects of ``AsyncOmni.generate`` and ``Omni.generate``. Each
has an optional ``details``: the request's ``OmniErrorDetails`` when it
failed and the caller asked for records instead of exceptions
(``Omni.generate(..., raise_on_error=False)``); ``None`` on success. These
objects never carry exceptions, tracebacks or anything the normalizer did
not produce, and this module must not import vLLM or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_omni.errors.details import OmniErrorDetails

__all__ = ["DiffusionOutput", "OmniRequestOutput", "TextChoice"]


@dataclass(slots=True)
class DiffusionOutput:
    """The result of an image or video stage: encoded media plus its shape."""

    images: list[bytes] = field(default_factory=list)  # PNG
    video: bytes | None = None  # GIF
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    num_frames: int | None = None
    seed: int | None = None
    details: OmniErrorDetails | None = None


@dataclass(slots=True)
class TextChoice:
    """One of a text request's ``n`` choices, complete (the final output's
    ``choices``). ``logprobs`` is in the OpenAI shape of the request's API
    (chat: a list of per-token entries; completions: the four arrays)."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    logprobs: Any = None


@dataclass(slots=True)
class OmniRequestOutput:
    """One step of a request's result stream; the last one has ``finished``.

    Text requests stream one output per token: ``text_delta`` is the new
    token of choice ``index`` (with its ``logprobs``, and its
    ``finish_reason`` on the choice's last delta), ``text`` the text of that
    choice so far. The final output (``finished=True``, empty ``text_delta``)
    carries everything: the full ``text`` (choice 0), every choice in
    ``choices``, ``audio`` (WAV), and for image/video routes ``diffusion``
    (``image``/``images`` PNG, ``video`` GIF).
    """

    request_id: str
    finished: bool = False
    text: str = ""
    text_delta: str = ""
    finish_reason: str | None = None
    index: int = 0
    logprobs: Any = None
    choices: list[TextChoice] = field(default_factory=list)
    audio: bytes | None = None  # WAV, 16-bit PCM mono
    diffusion: DiffusionOutput | None = None
    # The stage that produced this output (the last stage of the route when finished).
    stage_id: int | None = None
    # Per-stage metadata reported by the stages (sample rate, sizes, seeds).
    meta: dict[str, Any] = field(default_factory=dict)
    details: OmniErrorDetails | None = None

    @property
    def images(self) -> list[bytes]:
        return [] if self.diffusion is None else self.diffusion.images

    @property
    def image(self) -> bytes | None:
        """The first generated image (PNG), if any."""
        return self.images[0] if self.images else None

    @property
    def video(self) -> bytes | None:
        """The generated video (GIF), if any."""
        return None if self.diffusion is None else self.diffusion.video

    @property
    def failed(self) -> bool:
        return self.details is not None
