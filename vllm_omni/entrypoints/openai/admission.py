"""Refusal at admission before a request is routed or its body read (issue 46).

A generation route (``@admitted``) asks the engine whether admission would
refuse the request (``AsyncOmni.hold_admission``) before a byte of the body
is read, decoded or validated: an overloaded server answers upstream's
``QueueOverflowError`` (503, ``Retry-After``) at once, through the same error
boundary, record, metrics and log line as a refusal in ``generate``. A
request let through holds its place and yields until the requests read
with it have been asked (``AdmissionGate._settle``), so they are refused
before its own work starts. The engine's own admission
in ``generate`` stays the authority: a request let through here may still be
refused there, none is admitted past the limit. A dead engine is left to the
route (its own 503 names the failure).

The check runs in ``AdmissionGate``, right inside the error boundary, for
the paths (and methods) whose route is admitted, looked up in a table built
once the routes are known: a refusal does not pass the framework's layers
(the exception handlers, the router, the route's own wrappers): about
15 µs of the 370 an overloaded server spent to refuse a request
(docs/performance.md). The API key is checked first, as the route would: a
request without it is answered 401, never 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm_omni.entrypoints.openai.auth import require_api_key
from vllm_omni.errors.http.request_ids import scope_request_id

__all__ = ["AdmissionGate", "admit_before_routing", "admitted"]

_MARK = "__omni_admitted__"
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def admitted(endpoint: Endpoint) -> Endpoint:
    """Mark a route's endpoint as one that submits work to the engine."""
    setattr(endpoint, _MARK, True)
    return endpoint


# Turns of the event loop an admitted request waits at most for the
# requests arriving with it (each turn is short unless requests arrive).
_SETTLE_TURNS = 32


class _Admitted(NamedTuple):
    route: APIRoute
    methods: frozenset[str]
    keyed: bool  # the route requires the API key


class AdmissionGate:
    """Pure ASGI, the one middleware inside the error boundary: an admitted
    route's request holds its place at admission, or is refused, before it
    is routed. Nothing here runs the route in another task."""

    def __init__(self, app: ASGIApp, paths: Mapping[str, _Admitted]) -> None:
        self.app = app
        self._paths = dict(paths)
        # Requests the gate has asked admission for, ever: an admitted one
        # waits while this still grows (``_settle``).
        self._asked = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            entry = self._paths.get(get_route_path(scope))
            if entry is not None and scope["method"] in entry.methods:
                engine = getattr(scope["app"].state, "engine_client", None)
                if engine is not None and not engine.errored:
                    await self._admit(entry, engine, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _admit(
        self, entry: _Admitted, engine: Any, scope: Scope, receive: Receive, send: Send
    ) -> None:
        # The route is known: named on the request as the router names it
        # (a trace span's name), whether the request is refused or served.
        scope["route"] = entry.route
        if entry.keyed:
            await require_api_key(HTTPConnection(scope))
        self._asked += 1
        with engine.hold_admission(scope_request_id(scope)):
            await self._settle()
            await self.app(scope, receive, send)

    async def _settle(self) -> None:
        """Let the requests that arrive with this one reach their own check
        first: a refusal is answered at once, not after the admitted
        requests' work (this one's place is held meanwhile). A burst is read
        over several turns of the event loop, and a request read in one turn
        reaches the gate in the next, after the requests already waiting:
        this waits until two turns in a row bring none (at most
        ``_SETTLE_TURNS`` turns)."""
        quiet = 0
        for _ in range(_SETTLE_TURNS):
            asked = self._asked
            await asyncio.sleep(0)
            quiet = quiet + 1 if self._asked == asked else 0
            if quiet == 2:
                return


def _serving_route(app: FastAPI, path: str, method: str) -> object | None:
    """The route the router gives a request for ``path`` and ``method``: the
    first that matches it fully."""
    scope = {"type": "http", "path": path, "root_path": "", "method": method}
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route
    return None


def admit_before_routing(app: FastAPI) -> None:
    """Ask admission before routing for every ``@admitted`` route: the gate,
    inside the error boundary (call it last, after ``install_error_handling``
    and ``install_tracing``, which keep their places next to the boundary).
    An admitted route's path must be fixed (no parameters), and the route
    the one the router serves it with."""
    paths: dict[str, _Admitted] = {}
    for route in app.router.routes:
        if not (isinstance(route, APIRoute) and getattr(route.endpoint, _MARK, False)):
            continue
        if route.param_convertors:
            raise RuntimeError(f"admitted route {route.path!r} has path parameters")
        methods = frozenset(
            m
            for m in route.methods or ()
            if _serving_route(app, route.path, m) is route
        )
        if methods:
            keyed = any(dep.dependency is require_api_key for dep in route.dependencies)
            paths[route.path] = _Admitted(route, methods, keyed)
    app.user_middleware.append(Middleware(AdmissionGate, paths=paths))
