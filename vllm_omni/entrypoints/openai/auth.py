"""API-key authentication for every route (HTTP and WebSocket).

A FastAPI dependency, so a rejection is an ordinary semantic exception raised
inside the routes and rendered by the error boundary: 401
``AuthenticationError`` in the canonical envelope, and for a WebSocket a
denied handshake. Keys are compared in constant time.

FastAPI reads and parses a body (spooling multipart files to disk) before it
solves a route's dependencies, so a dependency alone would answer an
unauthenticated malformed body with 400. ``authenticate_before_body`` wraps
every route that declares the dependency so the key is checked when the route
is matched, before a byte of the body is read: 401 whatever the body.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm_omni.errors import OmniClientError

__all__ = ["authenticate_before_body", "authenticate_documents", "require_api_key"]


def _presented_key(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    # Browsers cannot set headers on a WebSocket handshake; accept the key as
    # a subprotocol-free header alternative used by OpenAI-style clients.
    return conn.headers.get("x-api-key")


async def require_api_key(conn: HTTPConnection) -> None:
    """Reject the request with 401 unless it presents one of the configured
    keys (``--api-key`` takes several, as in ``vllm serve``)."""
    expected: tuple[bytes, ...] = getattr(conn.app.state, "api_keys", ())
    if not expected:
        return
    presented = _presented_key(conn)
    if presented is None or not any(
        hmac.compare_digest(presented.encode(), key) for key in expected
    ):
        raise OmniClientError(
            "Invalid or missing API key.",
            status_code=401,
            error_type="AuthenticationError",
        )


def _checked_first(route_app: ASGIApp) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await require_api_key(HTTPConnection(scope))
        await route_app(scope, receive, send)

    return app


def authenticate_before_body(app: FastAPI) -> None:
    """Check the key of every route that requires one before it reads its body."""
    for route in app.router.routes:
        if not isinstance(route, APIRoute | APIWebSocketRoute):
            continue
        if any(dep.dependency is require_api_key for dep in route.dependencies):
            route.app = _checked_first(route.app)


def authenticate_documents(app: FastAPI) -> None:
    """The OpenAPI document and its pages (``/openapi.json``, ``/docs``,
    ``/redoc``) need the key too: only ``/health`` and ``/metrics`` are open
    (docs/serving.md, "API keys")."""
    paths = {
        app.openapi_url,
        app.docs_url,
        app.redoc_url,
        app.swagger_ui_oauth2_redirect_url,
    }
    for route in app.router.routes:
        if isinstance(route, Route) and route.path in paths:
            route.app = _checked_first(route.app)
