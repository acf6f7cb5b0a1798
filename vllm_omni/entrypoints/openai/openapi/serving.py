"""Serving ``/openapi.json``: the document built in a worker thread at
start-up (``prepare``), per engine, and the route that awaits it off the
event loop."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse

from vllm_omni.entrypoints.openai.openapi.document import Served, narrowed
from vllm_omni.entrypoints.openai.schema_errors import Schema

if TYPE_CHECKING:
    from fastapi import FastAPI

    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = ["endpoint", "prepare", "served", "served_for"]


def prepare(app: FastAPI) -> None:
    """Narrow the document for the app's engine in a worker thread, started
    by ``init_app_state``: FastAPI's own document of upstream's request
    models takes ~0.4 s, which the server need not wait for before
    ``/health``; a request that needs it first awaits it (``check_body``)."""
    engine = app.state.engine_client
    app.state.openapi_task = asyncio.get_running_loop().create_task(
        asyncio.to_thread(narrowed, app, engine)
    )


def served_for(app: FastAPI) -> Served | None:
    """The narrowed document of the app's engine: the one ``prepare`` built,
    or built now (an engine attached without ``init_app_state``, or a
    ``/openapi.json`` before the thread is done)."""
    engine: AsyncOmni | None = getattr(app.state, "engine_client", None)
    if engine is None:
        return None
    task: asyncio.Task[Served] | None = getattr(app.state, "openapi_task", None)
    if task is not None and task.done() and task.result().engine is engine:
        return task.result()
    current: Served | None = getattr(app.state, "openapi_served", None)
    if current is None or current.engine is not engine:
        current = narrowed(app, engine)
        app.state.openapi_served = current
    return current


def served(app: FastAPI) -> Schema:
    """The document ``/openapi.json`` serves: narrowed to the app's engine,
    or FastAPI's own before an engine is attached. ``build_app`` installs it
    as ``app.openapi``."""
    current = served_for(app)
    if current is None:
        return app.__class__.openapi(app)
    return current.document


async def endpoint(request: Request) -> JSONResponse:
    """``GET /openapi.json``: the served document, awaited off the loop when
    ``prepare``'s thread is still building it (FastAPI's own route would
    build it on the loop: most of a second that every request waits)."""
    task: asyncio.Task[Served] | None = getattr(request.app.state, "openapi_task", None)
    if task is not None and not task.done():
        await asyncio.shield(task)
    return JSONResponse(served(request.app))
