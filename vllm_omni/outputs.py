"""What a caller gets back: ``OmniRequestOutput`` and ``DiffusionOutput``.

A failed request's output carries its record in ``details``, never an
exception; 0.30's flat error fields are properties derived from it
(docs/runtime.md §14). It must not import vLLM or torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.errors.details import OmniErrorDetails

__all__ = ["DiffusionOutput", "OmniRequestOutput", "TextChoice"]


def _deprecated(what: str, instead: str) -> None:
    warnings.warn(
        f"{what} is deprecated and will be removed in the next release; {instead}.",
        DeprecationWarning,
        stacklevel=3,
    )


class _FlatErrorFields:
    """0.30's flat error fields, read from ``details`` (deprecated)."""

    __slots__ = ()
    details: OmniErrorDetails | None

    @property
    def error(self) -> str | None:
        """Deprecated: ``details.message``."""
        _deprecated("The flat field error", "read details.message")
        return None if self.details is None else self.details.message

    @property
    def error_status_code(self) -> int | None:
        """Deprecated: ``details.status_code``."""
        _deprecated("The flat field error_status_code", "read details.status_code")
        return None if self.details is None else self.details.status_code

    @property
    def error_type(self) -> str | None:
        """Deprecated: ``details.error_type``."""
        _deprecated("The flat field error_type", "read details.error_type")
        return None if self.details is None else self.details.error_type


@dataclass(slots=True)
class DiffusionOutput(_FlatErrorFields):
    """The result of an image or video stage: encoded media plus its shape."""

    images: list[bytes] = field(default_factory=list)  # PNG
    video: bytes | None = None  # GIF
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    num_frames: int | None = None
    seed: int | None = None
    details: OmniErrorDetails | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> DiffusionOutput:
        """Deprecated 0.30 constructor: a failed output whose ``details``
        is ``normalize(exc)``."""
        _deprecated("DiffusionOutput.from_exception", "set details=normalize(exc)")
        from vllm_omni.errors.normalizer import normalize

        return cls(details=normalize(exc))


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
class OmniRequestOutput(_FlatErrorFields):
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

    @classmethod
    def from_error(
        cls,
        request_id: str,
        error_message: str,
        *,
        status_code: int | None = None,
        error_type: str | None = None,
    ) -> OmniRequestOutput:
        """Deprecated 0.30 constructor of a finished, failed output.

        Its flat fields are read as a 0.30 record is (``from_wire``, the one
        reader of legacy fields): no status is a server 500; a 4xx without a
        type gets its status's type.
        """
        _deprecated("OmniRequestOutput.from_error", "set details=normalize(exc)")
        details = OmniErrorDetails.from_wire(
            {
                "error": error_message,
                "status_code": status_code,
                "error_type": error_type,
                "request_id": request_id,
            }
        )
        return cls(request_id, finished=True, details=details)
