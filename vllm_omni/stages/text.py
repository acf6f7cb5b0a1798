"""The reference text stage: a deterministic "model" that streams token by token.

Owns the reference text generation and the validation of the text sampling
parameters (``max_tokens``, ``temperature``, ``seed``), which it reports as
``VLLMValidationError`` with ``parameter``. The reply is a pure function of
prompt and parameters (``reference_tokens``), so tests can compute the
expected output. It must stay fast and must not block its loop: it yields
control between tokens so an abort or a deadline can preempt it.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_omni.engine.messages import Payload, Submit
from vllm_omni.errors import VLLMValidationError
from vllm_omni.stages.base import Stage, bounded_float, bounded_int

__all__ = ["MAX_TOKENS_LIMIT", "TextParams", "TextStage", "reference_tokens"]

MAX_TOKENS_LIMIT = 4096
DEFAULT_MAX_TOKENS = 64
_SEED_RANGE = (-(2**63), 2**63 - 1)
_FILLER = ("omni", "stage", "audio", "image", "video", "token", "reference", "model")


@dataclass(frozen=True, slots=True)
class TextParams:
    """Validated text sampling parameters."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    seed: int | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TextParams:
        return cls(
            max_tokens=bounded_int(
                params, "max_tokens", DEFAULT_MAX_TOKENS, 1, MAX_TOKENS_LIMIT
            )
            or DEFAULT_MAX_TOKENS,
            temperature=bounded_float(params, "temperature", 0.0, 0.0, 2.0),
            seed=bounded_int(params, "seed", None, *_SEED_RANGE),
        )


def reference_tokens(prompt: str, params: TextParams) -> tuple[list[str], str]:
    """The reference reply to ``prompt`` as tokens, and its finish reason.

    Greedy (temperature 0) echoes the prompt; sampling shuffles prompt and
    filler words with a generator seeded by prompt and ``seed``.
    """
    words = ["You", "said:", *prompt.split()[:MAX_TOKENS_LIMIT]]
    if params.temperature > 0:
        key = f"{prompt}\0{params.seed}\0{params.temperature}".encode()
        rng = random.Random(hashlib.sha256(key).digest())
        pool = words + list(_FILLER)
        words = [rng.choice(pool) for _ in range(len(words))]
    finish_reason = "stop" if len(words) <= params.max_tokens else "length"
    words = words[: params.max_tokens]
    return [w if i == 0 else f" {w}" for i, w in enumerate(words)], finish_reason


class TextStage(Stage):
    """Streams the reference reply, one ``Payload(text=token)`` per token."""

    kind: ClassVar[str] = "text"

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        if not request.prompt.strip():
            raise VLLMValidationError("prompt must not be empty", parameter="prompt")
        params = TextParams.from_params(request.params)
        tokens, finish_reason = reference_tokens(request.prompt, params)
        for index, token in enumerate(tokens):
            last = index == len(tokens) - 1
            meta = {"finish_reason": finish_reason} if last else {}
            yield Payload(text=token, meta=meta)
            await asyncio.sleep(0)
