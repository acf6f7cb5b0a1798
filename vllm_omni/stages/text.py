"""The reference text stage: a deterministic "model" that streams token by token.

Validates the text sampling parameters and yields between tokens, so an
abort or a deadline can preempt it (docs/runtime.md §1).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_omni.errors import VLLMValidationError
from vllm_omni.stages.base import Stage, bounded_float, bounded_int
from vllm_omni.stages.ranges import Integers, Numbers, ParamRange, Strings
from vllm_omni.wire.messages import Payload, Submit

__all__ = [
    "MAX_CHOICES",
    "MAX_STOP",
    "MAX_TOKENS_LIMIT",
    "SEED_RANGE",
    "TEMPERATURE_RANGE",
    "TextParams",
    "TextStage",
    "reference_tokens",
]

MAX_TOKENS_LIMIT = 4096
MAX_CHOICES = 8
MAX_STOP = 4
DEFAULT_MAX_TOKENS = 64
SEED_RANGE = (-(2**63), 2**63 - 1)
TEMPERATURE_RANGE = (0.0, 2.0)
_FILLER = ("omni", "stage", "audio", "image", "video", "token", "reference", "model")


@dataclass(frozen=True, slots=True)
class TextParams:
    """Validated text sampling parameters."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TextParams:
        # Both are checked; max_completion_tokens (chat) supersedes the
        # deprecated max_tokens.
        limits = [
            bounded_int(params, name, None, 1, MAX_TOKENS_LIMIT)
            for name in ("max_tokens", "max_completion_tokens")
        ]
        return cls(
            max_tokens=limits[1] or limits[0] or DEFAULT_MAX_TOKENS,
            temperature=bounded_float(params, "temperature", 0.0, *TEMPERATURE_RANGE),
            seed=bounded_int(params, "seed", None, *SEED_RANGE),
            stop=_stop(params.get("stop")),
            n=bounded_int(params, "n", 1, 1, MAX_CHOICES) or 1,
        )


def _stop(value: object) -> tuple[str, ...]:
    """``stop`` as OpenAI gives it: a string or a list of up to four strings."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        isinstance(stops, list)
        and len(stops) <= MAX_STOP
        and all(isinstance(s, str) and s for s in stops)
    ):
        return tuple(stops)
    raise VLLMValidationError(
        f"stop must be a non-empty string or a list of up to {MAX_STOP} of them",
        parameter="stop",
    )


def reference_tokens(
    prompt: str, params: TextParams, choice: int = 0
) -> tuple[list[str], str]:
    """The reference reply to ``prompt`` as tokens, and its finish reason.

    Greedy (temperature 0) echoes the prompt; sampling shuffles prompt and
    filler words with a generator seeded by prompt, ``seed`` and the choice
    (so the ``n`` choices differ). The reply ends before the first ``stop``
    string (finish reason ``stop``), or after ``max_tokens`` (``length``).
    """
    words = ["You", "said:", *prompt.split()[:MAX_TOKENS_LIMIT]]
    if params.temperature > 0:
        key = f"{prompt}\0{params.seed}\0{params.temperature}".encode()
        if choice:
            key += f"\0{choice}".encode()
        rng = random.Random(hashlib.sha256(key).digest())
        pool = words + list(_FILLER)
        words = [rng.choice(pool) for _ in range(len(words))]
    finish_reason = "stop" if len(words) <= params.max_tokens else "length"
    words = words[: params.max_tokens]
    tokens = [w if i == 0 else f" {w}" for i, w in enumerate(words)]
    text = "".join(tokens)
    cut = min((at for s in params.stop if (at := text.find(s)) >= 0), default=-1)
    if cut < 0:
        return tokens, finish_reason
    kept: list[str] = []
    length = 0
    for token in tokens:
        if length + len(token) > cut:
            if cut > length:
                kept.append(token[: cut - length])
            break
        kept.append(token)
        length += len(token)
    return kept, "stop"


class TextStage(Stage):
    """Streams the reference reply, one ``Payload(text=token)`` per token and
    choice (``index``), the last of each choice with its finish reason."""

    kind: ClassVar[str] = "text"
    RANGES: ClassVar[Mapping[str, ParamRange]] = {
        "max_tokens": Integers(1, MAX_TOKENS_LIMIT),
        "max_completion_tokens": Integers(1, MAX_TOKENS_LIMIT),
        "temperature": Numbers(*TEMPERATURE_RANGE),
        "seed": Integers(*SEED_RANGE),
        "stop": Strings(MAX_STOP),
        "n": Integers(1, MAX_CHOICES),
    }

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        TextParams.from_params(params)

    async def generate(self, request: Submit) -> AsyncIterator[Payload]:
        if not request.prompt.strip():
            raise VLLMValidationError("prompt must not be empty", parameter="prompt")
        params = TextParams.from_params(request.params)
        for choice in range(params.n):
            tokens, finish_reason = reference_tokens(request.prompt, params, choice)
            if not tokens:
                yield Payload(index=choice, finish_reason=finish_reason)
            for index, token in enumerate(tokens):
                last = index == len(tokens) - 1
                yield Payload(
                    text=token,
                    index=choice,
                    finish_reason=finish_reason if last else None,
                )
                await asyncio.sleep(0)
