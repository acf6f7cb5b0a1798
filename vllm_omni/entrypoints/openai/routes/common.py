"""What every route module shares: the engine, the request id, stream errors.

Routes raise semantic exceptions and never build statuses or envelopes; the
two places a route needs the errors package directly are here: turning a
failure *after* headers into its terminal stream event, and the request id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection

from vllm_omni.errors import OmniServiceUnavailableError, VLLMNotFoundError
from vllm_omni.errors.fastapi import request_id_of

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = ["check_model", "engine_of", "request_id_of", "require_modality"]


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


def check_model(engine: AsyncOmni, model: str | None) -> None:
    """404 for a model name this server does not serve (as vLLM answers)."""
    if model is not None and model != engine.model_name:
        raise VLLMNotFoundError(f"The model `{model}` does not exist.")
