"""Refusal at admission before a request's body is read (issue 46).

A generation route (``@admitted``) asks the engine whether admission would
refuse the request (``AsyncOmni.hold_admission``) when the route is
matched, after the API key and before a byte of the body is read, decoded
or validated: an overloaded server answers upstream's ``QueueOverflowError``
(503, ``Retry-After``) at once, through the same error boundary, record,
metrics and log line as a refusal in ``generate``. A request let through
holds its place and yields once, so the requests read with it are refused
before its own work starts. The engine's own
admission in ``generate`` stays the authority: a request let through here
may still be refused there, none is admitted past the limit. A dead engine
is left to the route (its own 503 names the failure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm_omni.errors.http.request_ids import scope_request_id

__all__ = ["admit_before_body", "admitted"]

_MARK = "__omni_admitted__"
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def admitted(endpoint: Endpoint) -> Endpoint:
    """Mark a route's endpoint as one that submits work to the engine."""
    setattr(endpoint, _MARK, True)
    return endpoint


def _admitted_first(route_app: ASGIApp) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        engine = getattr(scope["app"].state, "engine_client", None)
        if engine is None or engine.errored:
            await route_app(scope, receive, send)
            return
        with engine.hold_admission(scope_request_id(scope)):
            # Let the requests that arrived with this one reach their own
            # check first: a refusal is answered at once, not after the
            # admitted requests' work (its place is held meanwhile).
            await asyncio.sleep(0)
            await route_app(scope, receive, send)

    return app


def admit_before_body(app: FastAPI) -> None:
    """Ask admission first on every ``@admitted`` route; call it before
    ``authenticate_before_body``, so the key is still checked first."""
    for route in app.router.routes:
        if isinstance(route, APIRoute) and getattr(route.endpoint, _MARK, False):
            route.app = _admitted_first(route.app)
