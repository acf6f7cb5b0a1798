"""The request id (``request_ids``): the client's when it is a safe token,
else a new one; decided once; exactly one ``X-Request-Id`` on every response,
success or error, and the error body names the same id."""

from __future__ import annotations

import os
import re

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from tests.errors.http.asgi_calls import Client, call, http_scope
from vllm_omni.errors import OmniConflictError
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.http import ErrorBoundary, install_error_handling
from vllm_omni.errors.http.request_ids import (
    ASGI_REQUEST_ID_HEADER,
    for_this_request,
    request_id_of,
    scope_request_id,
    with_request_id,
)

NEW_ID = re.compile(r"[0-9a-f]{32}")


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ok")
    async def ok(request: Request) -> dict[str, str]:
        return {"seen": request_id_of(request)}

    @app.get("/own-header")
    async def own_header() -> JSONResponse:
        return JSONResponse({}, headers={"X-Request-Id": "set-by-route"})

    @app.get("/conflict")
    async def conflict() -> dict[str, str]:
        raise OmniConflictError("job is still running")

    install_error_handling(app)
    return app


async def _get(
    path: str, headers: dict[str, str | bytes] | None = None
) -> httpx.Response:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get(path, headers=headers)


@pytest.mark.parametrize("path", ["/ok", "/conflict", "/missing"])
async def test_a_safe_client_id_is_kept_once(path: str) -> None:
    response = await _get(path, {"X-Request-Id": "client-42.a:b_c"})
    assert response.headers.get_list("x-request-id") == ["client-42.a:b_c"]
    if response.status_code >= 400:
        assert response.json()["error"]["request_id"] == "client-42.a:b_c"
    else:
        assert response.json() == {"seen": "client-42.a:b_c"}


@pytest.mark.parametrize(
    "unsafe",
    [b"has space", b"-leading-dash", b"x" * 129, b"caf\xe9", b"a/b", b""],
)
@pytest.mark.parametrize("path", ["/ok", "/conflict"])
async def test_an_unsafe_client_id_is_replaced(path: str, unsafe: bytes) -> None:
    response = await _get(path, {"X-Request-Id": unsafe})
    [sent] = response.headers.get_list("x-request-id")
    assert sent != unsafe.decode("latin-1")
    assert NEW_ID.fullmatch(sent)
    if response.status_code >= 400:
        assert response.json()["error"]["request_id"] == sent


async def test_without_a_client_id_each_request_gets_a_new_one() -> None:
    first, second = await _get("/ok"), await _get("/ok")
    ids = [r.headers.get_list("x-request-id") for r in (first, second)]
    assert all(len(found) == 1 and NEW_ID.fullmatch(found[0]) for found in ids)
    assert ids[0] != ids[1]
    assert first.json() == {"seen": ids[0][0]}  # the route saw the same id


async def test_a_route_that_names_its_response_is_not_named_twice() -> None:
    response = await _get("/own-header", {"X-Request-Id": "client-1"})
    assert response.headers.get_list("x-request-id") == ["set-by-route"]


async def test_the_boundary_names_a_bare_asgi_response() -> None:
    async def bare(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    scope = http_scope(headers=[(b"x-request-id", b"from-client")])
    client = await call(ErrorBoundary(bare), scope, Client())
    assert client.status == 204
    assert client.header_values(ASGI_REQUEST_ID_HEADER) == [b"from-client"]


def test_the_id_is_decided_once_per_scope() -> None:
    scope = http_scope(headers=[(b"x-request-id", b"bad id")])
    first = scope_request_id(scope)
    assert NEW_ID.fullmatch(first)
    scope["headers"] = [(b"x-request-id", b"good-id")]
    assert scope_request_id(scope) == first


def test_new_ids_are_distinct_across_draws_and_forks() -> None:
    """Fresh ids come from one ``os.urandom`` draw per few hundred requests:
    every one is 32 hex digits, none repeats (across draws too), and a
    forked child (a server's worker) does not hand out its parent's next
    ids."""
    ids = [scope_request_id(http_scope()) for _ in range(1000)]
    assert all(NEW_ID.fullmatch(rid) for rid in ids)
    assert len(set(ids)) == len(ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without pytest's exit
        os.close(read)
        child = ",".join(scope_request_id(http_scope()) for _ in range(8))
        os.write(write, child.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_ids = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent_ids = [scope_request_id(http_scope()) for _ in range(8)]
    assert len(child_ids) == 8 and all(NEW_ID.fullmatch(rid) for rid in child_ids)
    assert not set(child_ids) & set(parent_ids)


def test_with_request_id_adds_the_header_only_when_missing() -> None:
    scope = http_scope(headers=[(b"x-request-id", b"rid-1")])
    start = {"type": "http.response.start", "status": 200, "headers": []}
    named = with_request_id(start, scope)
    assert named["headers"] == [(b"x-request-id", b"rid-1")]
    assert start["headers"] == []  # the app's message is not mutated
    assert with_request_id(named, scope) is named


def test_a_stored_record_is_renamed_only_for_a_client_id() -> None:
    stored = OmniErrorDetails(
        category="client",
        status_code=409,
        error_type="ConflictError",
        message="job is still running",
        request_id="job-7",
    )
    with_client = http_scope(headers=[(b"x-request-id", b"client-9")])
    assert for_this_request(stored, with_client).request_id == "client-9"
    without = http_scope()
    assert for_this_request(stored, without) is stored
