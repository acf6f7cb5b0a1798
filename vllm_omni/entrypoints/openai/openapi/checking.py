"""Checking a request body against the served document: a 400 naming the
first field it does not admit, before any stage runs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_omni.entrypoints.openai.openapi.document import Served
from vllm_omni.entrypoints.openai.openapi.narrowing import JSON
from vllm_omni.entrypoints.openai.openapi.serving import served_for
from vllm_omni.entrypoints.openai.schema_errors import first_error

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

__all__ = ["check_body"]


async def check_body(
    conn: HTTPConnection,
    route: str,
    body: Mapping[str, Any],
    media_type: str = JSON,
) -> None:
    """400 ``VLLMValidationError`` naming the first field of ``body`` that
    the served document does not admit for ``route``."""
    task: asyncio.Task[Served] | None = getattr(conn.app.state, "openapi_task", None)
    if task is not None and not task.done():
        # Shielded: a request that goes away must not cancel the build.
        await asyncio.shield(task)
    current = served_for(conn.app)
    if current is None:
        raise RuntimeError("check_body needs the app's engine")
    error = first_error(
        current.validators[route, media_type],
        current.roots[route, media_type],
        body,
        current.formats,
    )
    if error is not None:
        raise error
