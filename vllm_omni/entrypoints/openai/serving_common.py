"""What every serving path shares: the engine, the request limits and checks.

Serving modules and routes raise semantic exceptions and never build statuses
or envelopes; this module holds the checks they all make (model, modality,
prompt) and reads the engine and limits the app holds. It imports no route.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, TypeVar

from starlette.requests import HTTPConnection

from vllm_omni.entrypoints.openai.limits import RequestLimits
from vllm_omni.errors import (
    OmniServiceUnavailableError,
    VLLMNotFoundError,
    VLLMValidationError,
)
from vllm_omni.errors.http import request_id_of
from vllm_omni.errors.text import make_safe

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = [
    "check_model",
    "check_prompt",
    "engine_of",
    "limits_of",
    "request_id_of",
    "require_modality",
    "resolved",
    "unknown_model",
]

_T = TypeVar("_T")


async def resolved(value: _T | Awaitable[_T]) -> _T:
    """An engine's answer: ``AsyncOmni`` answers some questions at once
    (``check_faulted``, the fault-tolerance status), the client of an engine
    in another process (``--api-server-count``) with an awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value


def engine_of(conn: HTTPConnection) -> AsyncOmni:
    engine: AsyncOmni | None = getattr(conn.app.state, "engine_client", None)
    if engine is None:
        raise OmniServiceUnavailableError("The engine is not running.")
    return engine


def require_modality(engine: AsyncOmni, modality: str) -> None:
    """503 for a route whose modality this pipeline has no stage for."""
    if modality not in engine.modalities:
        raise OmniServiceUnavailableError(
            f"The pipeline has no {modality} stage; this route is unavailable."
        )


def unknown_model(model: str) -> VLLMNotFoundError:
    """The 404 on ``model`` for a model name this server does not serve (as
    vLLM answers), the name made safe to show (``vllm_omni.errors.text``)."""
    error = VLLMNotFoundError(f"The model `{make_safe(model)}` does not exist.")
    error.parameter = "model"  # type: ignore[attr-defined]
    return error


def check_model(engine: AsyncOmni, model: str | None) -> None:
    """404 on ``model`` for a model name this server does not serve."""
    if model is not None and model != engine.model_name:
        raise unknown_model(model)


def limits_of(conn: HTTPConnection) -> RequestLimits:
    limits: RequestLimits | None = getattr(conn.app.state, "limits", None)
    return limits if limits is not None else RequestLimits()


def check_prompt(conn: HTTPConnection, prompt: str, parameter: str) -> None:
    """400 on ``parameter`` for a prompt that is blank or over the length limit."""
    if not prompt.strip():
        raise VLLMValidationError(
            f"{parameter} must be a non-empty string", parameter=parameter
        )
    limit = limits_of(conn).max_prompt_chars
    if len(prompt) > limit:
        raise VLLMValidationError(
            f"{parameter} must be at most {limit} characters", parameter=parameter
        )
