"""Folds each stage's payloads into the request's ``OmniRequestOutput``."""

from __future__ import annotations

from typing import Any

from vllm_omni.config import StageConfig
from vllm_omni.outputs import DiffusionOutput, OmniRequestOutput, TextChoice
from vllm_omni.wire import messages as m

__all__ = ["TEXT_KINDS", "accumulate", "fold_choice", "fold_stage"]

# Stage kinds whose chunks are text choices.
TEXT_KINDS = ("text", "vllm")


def fold_choice(final: OmniRequestOutput, chunk: m.Payload) -> TextChoice:
    """Fold a text stage's chunk into its choice of ``final`` (choice 0's
    text is also ``final.text``); the updated choice."""
    while len(final.choices) <= chunk.index:
        final.choices.append(TextChoice(index=len(final.choices)))
    choice = final.choices[chunk.index]
    choice.text += chunk.text
    if chunk.index == 0:
        final.text = choice.text
    if chunk.finish_reason is not None:
        choice.finish_reason = chunk.finish_reason
    if chunk.logprobs is not None:
        choice.logprobs = _merge_logprobs(choice.logprobs, chunk.logprobs)
    return choice


def _merge_logprobs(into: Any, chunk: Any) -> Any:
    """Chat logprobs are a list of entries; completion logprobs four arrays."""
    if into is None:
        return chunk
    if isinstance(into, list):
        return into + list(chunk)
    return {key: [*(into.get(key) or ()), *(chunk.get(key) or ())] for key in chunk}


def accumulate(into: m.Payload, chunk: m.Payload) -> None:
    """Add one chunk of a stage to that stage's whole result."""
    into.text += chunk.text
    into.tokens.extend(chunk.tokens)
    into.images.extend(chunk.images)
    if chunk.audio is not None:
        into.audio = chunk.audio
    if chunk.video is not None:
        into.video = chunk.video
    into.meta.update(chunk.meta)


def fold_stage(final: OmniRequestOutput, stage: StageConfig, result: m.Payload) -> None:
    """Fold a finished stage's result into the request's final output."""
    if stage.kind in TEXT_KINDS:
        final.finish_reason = final.choices[0].finish_reason if final.choices else None
    elif stage.kind == "vocoder":
        final.audio = result.audio
    elif stage.kind in ("image", "video"):
        meta = result.meta
        final.diffusion = DiffusionOutput(
            images=list(result.images),
            video=result.video,
            width=meta.get("width"),
            height=meta.get("height"),
            fps=meta.get("fps"),
            num_frames=meta.get("num_frames"),
            seed=meta.get("seed"),
        )
