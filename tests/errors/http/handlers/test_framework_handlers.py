"""The framework's failures in the canonical envelope (``handlers``): 404,
405 with every allowed method, request validation naming the field without
echoing input, and the same 404 for a WebSocket handshake no route takes."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, Field

from tests.errors.http.asgi_calls import Client, call, http_scope
from vllm_omni.errors.http import install_error_handling


class Body(BaseModel):
    temperature: float = Field(ge=0, le=2)
    stop: str | list[str] | None = None


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/jobs/{job_id}")
    async def read(job_id: str) -> dict[str, str]:
        return {"id": job_id}

    @app.delete("/v1/jobs/{job_id}")
    async def delete(job_id: str) -> dict[str, str]:
        return {"deleted": job_id}

    @app.post("/v1/generate")
    async def generate(body: Body) -> dict[str, float]:
        return {"temperature": body.temperature}

    install_error_handling(app)
    return app


async def _send(method: str, path: str, **kwargs: object) -> httpx.Response:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.request(method, path, **kwargs)  # type: ignore[arg-type]


async def test_an_unknown_route_is_a_canonical_404() -> None:
    response = await _send("GET", "/v1/nowhere")
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("NotFoundError", 404)
    assert error["request_id"] == response.headers["x-request-id"]


async def test_a_405_allows_the_methods_of_every_route_on_the_path() -> None:
    response = await _send("PUT", "/v1/jobs/7")
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, GET"
    assert response.json()["error"]["code"] == 405


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 9}, "temperature"),
        ({"temperature": "sk-live-SECRET123456"}, "temperature"),
        # Every member of the union fails: the field is the one they share.
        ({"temperature": 1, "stop": 5}, "stop"),
        ({}, "temperature"),
    ],
)
async def test_validation_names_the_field_and_never_echoes_input(
    body: dict[str, object], param: str
) -> None:
    response = await _send("POST", "/v1/generate", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", param)
    assert error["message"].startswith("Invalid request: ")
    assert "SECRET" not in response.text


async def test_malformed_json_is_a_400_about_the_body() -> None:
    response = await _send(
        "POST",
        "/v1/generate",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"


@pytest.mark.parametrize("with_body", [True, False])
async def test_a_websocket_no_route_takes_is_denied_with_the_404(
    with_body: bool,
) -> None:
    scope = {
        **http_scope("/v1/nowhere", headers=[(b"x-request-id", b"ws-1")]),
        "type": "websocket",
        "scheme": "ws",
        "subprotocols": [],
        "extensions": {"websocket.http.response": {}} if with_body else {},
    }
    client = await call(_app(), scope, Client([{"type": "websocket.connect"}]))
    if not with_body:
        # Before accept, without the extension, a close frame is all there is.
        assert client.sent == [{"type": "websocket.close", "code": 1008}]
        return
    start, body = client.sent
    assert start["type"] == "websocket.http.response.start"
    assert start["status"] == 404
    assert (b"x-request-id", b"ws-1") in start["headers"]
    error = json.loads(body["body"])["error"]
    assert (error["type"], error["code"], error["request_id"]) == (
        "NotFoundError",
        404,
        "ws-1",
    )
