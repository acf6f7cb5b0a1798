"""Session-wide real servers for the end-to-end tests, and one check on every
response they send.

Every HTTP response an e2e test receives — through httpx, the OpenAI SDK's
client or schemathesis' ``requests`` — must carry exactly one
``X-Request-Id`` (docs/design.md §10): successes, errors, SSE, 405, unknown routes,
``/health`` and ``/metrics`` alike. The clients are wrapped for the session;
a test that received a response without exactly one fails after its body ran.
Nothing is raised inside a client: the SDK would turn that into retries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
import requests

from tests.e2e.omni_server import OmniServer, start_server, write_pipeline

API_KEY = "test-key-0123456789"
REQUEST_ID = "x-request-id"

# "METHOD url -> status: the X-Request-Id values", for the running test.
_WITHOUT_ONE_ID: list[str] = []


def _note(method: str, url: object, status: int, values: list[str]) -> None:
    if len(values) != 1:
        _WITHOUT_ONE_ID.append(f"{method} {url} -> {status}: {values}")


def _checked_send(send: Callable[..., Any]) -> Callable[..., Any]:
    def checked(client: Any, request: Any, **kwargs: Any) -> Any:
        response = send(client, request, **kwargs)
        values = response.headers.get_list(REQUEST_ID)
        _note(request.method, request.url, response.status_code, values)
        return response

    return checked


def _checked_async_send(send: Callable[..., Any]) -> Callable[..., Any]:
    async def checked(client: Any, request: Any, **kwargs: Any) -> Any:
        response = await send(client, request, **kwargs)
        values = response.headers.get_list(REQUEST_ID)
        _note(request.method, request.url, response.status_code, values)
        return response

    return checked


def _checked_requests_send(send: Callable[..., Any]) -> Callable[..., Any]:
    def checked(session: Any, request: Any, **kwargs: Any) -> Any:
        response = send(session, request, **kwargs)
        # ``requests`` joins repeated headers; the raw ones keep each value.
        values = response.raw.headers.getlist(REQUEST_ID)
        _note(request.method, request.url, response.status_code, values)
        return response

    return checked


@pytest.fixture(scope="session", autouse=True)
def _request_id_on_every_response() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for module in (httpx, httpx2):
            patch.setattr(module.Client, "send", _checked_send(module.Client.send))
            patch.setattr(
                module.AsyncClient,
                "send",
                _checked_async_send(module.AsyncClient.send),
            )
        patch.setattr(
            requests.Session, "send", _checked_requests_send(requests.Session.send)
        )
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    _WITHOUT_ONE_ID.clear()
    result = yield
    assert not _WITHOUT_ONE_ID, (
        "responses without exactly one X-Request-Id: " + "; ".join(_WITHOUT_ONE_ID)
    )
    return result


@pytest.fixture(scope="session")
def omni_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    """One ``vllm-omni serve`` on the reference stages plus fault markers,
    behind an API key, shared by every e2e module that needs a healthy server."""
    directory = tmp_path_factory.mktemp("omni-server")
    server = start_server(directory, write_pipeline(directory), api_key=API_KEY)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(omni_server: OmniServer) -> openai.OpenAI:
    """The official SDK against the shared server, with its key, no retries
    (a module with another server defines its own ``client``)."""
    return openai.OpenAI(
        base_url=omni_server.base_url + "/v1",
        api_key=omni_server.api_key,
        max_retries=0,
    )
