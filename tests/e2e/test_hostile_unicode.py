"""Text that is not Unicode is a 400 naming its field, never a 5xx (issue 24).

JSON allows ``"\\ud800"``; Python decodes it into a string that no UTF-8
encoder accepts. Against the shared ``vllm-omni serve`` this sends a lone
surrogate (high, low, and a reversed pair) in every string field of every
route's request body, enumerated from the server's own ``/openapi.json`` (so
a new route or field is covered without touching this file): JSON bodies,
multipart form fields and file names, vendor extras and field names, plus
headers, query strings, path parameters and realtime WebSocket events.
Every answer is the canonical 400 ``BadRequestError`` naming the field (a
``model`` that is not Unicode is the 404 of an unknown model, the name made
safe), and ``http_requests_total`` gains no 5xx.

The bodies are sent as bytes with ``httpx``: the OpenAI SDK, like any client
that encodes JSON as UTF-8, cannot even send such a string.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.e2e.canonical import assert_canonical_error
from tests.e2e.omni_server import OmniServer
from tests.e2e.servers import metric_samples, sample_delta, settled_samples

SURROGATES = {"high": "\ud800", "low": "\udc00", "reversed pair": "\udc00\ud800"}
# What the server shows for each: one U+FFFD per lone surrogate.
SAFE = {name: "\ufffd" * len(text) for name, text in SURROGATES.items()}
HTTP = "http_requests_total"
ERRORS = "vllm_omni:errors_total"
# UTF-8 bytes of a surrogate (CESU-8): what a client can put in a header, a
# URL or a WebSocket text frame, none of which can hold a lone surrogate.
SURROGATE_BYTES = b"\xed\xa0\x80"
_UNICODE_MESSAGE = "{} is not valid Unicode (it holds a lone surrogate)."

Path = tuple[str | int, ...]


# -- the request bodies every route declares, from /openapi.json ---------------


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["components"]["schemas"][name]
    return schema


def _variants(
    schema: dict[str, Any] | bool, spec: dict[str, Any]
) -> list[dict[str, Any]]:
    if isinstance(schema, bool):
        # A field the pipeline refuses outright (``false``): no value to send.
        return []
    schema = _resolve(schema, spec)
    choices = schema.get("anyOf") or schema.get("oneOf")
    if choices is None:
        return [schema]
    return [
        variant
        for choice in choices
        for variant in _variants(choice, spec)
        if variant.get("type") != "null"
    ]


def _is_file(schema: dict[str, Any]) -> bool:
    # OpenAPI 3.1 marks an upload by its media type (3.0 by format: binary).
    return "contentMediaType" in schema or schema.get("format") == "binary"


def _minimal(schema: dict[str, Any], spec: dict[str, Any]) -> Any:
    """A small value of ``schema`` (its first variant), required fields only."""
    schema = _variants(schema, spec)[0]
    kind = schema.get("type")
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        properties = schema.get("properties", {})
        return {
            name: _minimal(properties[name], spec)
            for name in schema.get("required", ())
        }
    if kind == "array":
        return [_minimal(schema["items"], spec)] * schema.get("minItems", 0)
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return "hello"


def _holes(schema: dict[str, Any], spec: dict[str, Any], text: str) -> Iterator[Any]:
    """(path, document) for every string of ``schema``: a small valid document
    whose string at ``path`` is ``text``."""
    for variant in _variants(schema, spec):
        kind = variant.get("type")
        if kind == "string" and not _is_file(variant):
            yield (), text
        elif kind == "object":
            base = _minimal(variant, spec)
            for name, field in variant.get("properties", {}).items():
                for path, value in _holes(field, spec, text):
                    yield (name, *path), {**base, name: value}
        elif kind == "array":
            for path, value in _holes(variant["items"], spec, text):
                yield (0, *path), [value]


def _bodies(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(route, media type, body schema) of every operation that takes a body."""
    found = []
    for route, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            assert method == "post" or not content, (route, method)
            found += [(route, media, body["schema"]) for media, body in content.items()]
    return found


@pytest.fixture(scope="module")
def spec(omni_server: OmniServer) -> dict[str, Any]:
    response = httpx.get(
        omni_server.base_url + "/openapi.json", headers=omni_server.headers()
    )
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


@pytest.fixture(scope="module")
def no_5xx(omni_server: OmniServer) -> Iterator[None]:
    """Every request of this module: no 5xx in ``http_requests_total``."""
    before = metric_samples(omni_server.base_url)
    yield
    after = metric_samples(omni_server.base_url)
    assert sample_delta(before, after, HTTP) > 0
    assert sample_delta(before, after, HTTP, status="5xx") == 0


# -- what every answer must be --------------------------------------------------


def _field(path: Path) -> str:
    return ".".join(str(part) for part in path)


def _assert_refused(response: httpx.Response, path: Path, name: str) -> None:
    """400 naming ``path``; for a top-level ``model``, the unknown-model 404."""
    assert response.status_code < 500, response.text
    body = response.json()
    assert_canonical_error(response.status_code, body, response.headers)
    error = body["error"]
    if path == ("model",):
        expected = (404, "NotFoundError", "model")
        message = f"The model `{SAFE[name]}` does not exist."
    else:
        expected = (400, "BadRequestError", _field(path))
        message = _UNICODE_MESSAGE.format(_field(path))
    assert (response.status_code, error["type"], error["param"]) == expected, body
    assert error["message"] == message


_CLIENTS: dict[str, httpx.Client] = {}


def _post(server: OmniServer, route: str, content: bytes, media: str) -> httpx.Response:
    # One kept-alive connection: hundreds of requests, each refused at once.
    client = _CLIENTS.get(server.base_url)
    if client is None:
        client = _CLIENTS[server.base_url] = httpx.Client(timeout=30)
    return client.post(
        server.base_url + route,
        content=content,
        headers={**server.headers(), "Content-Type": media},
    )


def _multipart(fields: dict[str, Any], files: dict[str, str]) -> tuple[bytes, str]:
    """A multipart body declared as UTF-7, the codec in which a part's bytes
    decode to a lone surrogate; ``files`` maps a field to its file name."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'
        parts.append(f"{head}\r\n\r\n".encode() + str(value).encode("utf-7") + b"\r\n")
    for name, filename in files.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'
        parts.append(
            f'{head}; filename="'.encode()
            + filename.encode("utf-7")
            + b'"\r\nContent-Type: image/png\r\n\r\n\x89PNG\r\n'
        )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}; charset=utf-7"


@pytest.mark.parametrize("name", SURROGATES)
def test_every_string_field_of_every_body(
    omni_server: OmniServer, spec: dict[str, Any], no_5xx: None, name: str
) -> None:
    text = SURROGATES[name]
    checked = []
    for route, media, schema in _bodies(spec):
        for path, document in _holes(schema, spec, text):
            if media == "application/json":
                content = json.dumps(document).encode()
            else:
                body_schema = _resolve(schema, spec)
                files = {
                    field: "in.png"
                    for field, prop in body_schema.get("properties", {}).items()
                    # ``false``: a form field the pipeline refuses outright
                    if not isinstance(prop, bool) and _is_file(_resolve(prop, spec))
                }
                fields = {k: v for k, v in document.items() if k not in files}
                content, media = _multipart(fields, files)
            response = _post(omni_server, route, content, media)
            _assert_refused(response, path, name)
            checked.append((route, _field(path)))
    # The enumeration reached every route with a body, and nested fields.
    assert {route for route, _ in checked} == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/audio/speech",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/videos",
        "/v1/fault_tolerance/apply",
    }
    assert ("/v1/chat/completions", "messages.0.content") in checked
    assert ("/v1/chat/completions", "messages.0.content.0.text") in checked
    assert ("/v1/audio/speech", "voice") in checked


@pytest.mark.parametrize("name", SURROGATES)
def test_vendor_extras_and_field_names(
    omni_server: OmniServer, no_5xx: None, name: str
) -> None:
    text = SURROGATES[name]
    message = {"role": "user", "content": "hi"}
    cases: list[tuple[dict[str, Any], str, str]] = [
        (
            {"messages": [message], "lora": text},
            "lora",
            _UNICODE_MESSAGE.format("lora"),
        ),
        (
            {"messages": [message], "metadata": {"tags": ["ok", text]}},
            "metadata.tags.1",
            _UNICODE_MESSAGE.format("metadata.tags.1"),
        ),
        (
            {"messages": [message], text: 1},
            "body",
            "A field name in the body is not valid Unicode (it holds a lone "
            "surrogate).",
        ),
        (
            {"messages": [{**message, text: "x"}]},
            "messages.0",
            "A field name in messages.0 is not valid Unicode (it holds a lone "
            "surrogate).",
        ),
    ]
    for document, param, expected in cases:
        response = _post(
            omni_server,
            "/v1/chat/completions",
            json.dumps(document).encode(),
            "application/json",
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("BadRequestError", param)
        assert error["message"] == expected


def test_raw_surrogate_bytes_and_other_encodings(
    omni_server: OmniServer, no_5xx: None
) -> None:
    """UTF-8 bytes of a surrogate (not an escape) and a UTF-16 body decode to
    a lone surrogate too (``json.loads`` uses ``surrogatepass``)."""
    utf8 = b'{"messages":[{"role":"user","content":"a' + SURROGATE_BYTES + b'"}]}'
    utf16 = (
        '{"prompt":"a'.encode("utf-16-le")
        + b"\x00\xd8"  # U+D800 alone, little-endian
        + '"}'.encode("utf-16-le")
    )
    for route, content, param in (
        ("/v1/chat/completions", utf8, "messages.0.content"),
        ("/v1/images/generations", utf16, "prompt"),
    ):
        response = _post(omni_server, route, content, "application/json")
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def test_multipart_file_name(omni_server: OmniServer, no_5xx: None) -> None:
    for name, text in SURROGATES.items():
        content, media = _multipart({"prompt": "a cat"}, {"image": f"{text}.png"})
        response = _post(omni_server, "/v1/images/edits", content, media)
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("BadRequestError", "image")
        assert error["message"] == (
            "The file name of image is not valid Unicode (it holds a lone surrogate)."
        )


def test_headers_query_and_path(
    omni_server: OmniServer, spec: dict[str, Any], no_5xx: None
) -> None:
    """A header, URL or path cannot carry a lone surrogate (bytes decoded as
    Latin-1, percent-escapes as UTF-8 with replacement); their surrogate
    bytes are an ordinary wrong value, never a 5xx."""
    key = omni_server.headers()["Authorization"].encode()
    # A key with extra bytes is a wrong key.
    response = httpx.get(
        omni_server.base_url + "/v1/models",
        headers={"Authorization": key + SURROGATE_BYTES},
    )
    assert (response.status_code, response.json()["error"]["type"]) == (
        401,
        "AuthenticationError",
    )
    # A request id or any other header with such bytes is just ignored.
    response = httpx.get(
        omni_server.base_url + "/v1/models",
        headers={
            "Authorization": key,
            "X-Request-Id": b"id-" + SURROGATE_BYTES,
            "X-Anything": SURROGATE_BYTES,
        },
    )
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == "omni-reference"
    escaped = "%ED%A0%80"
    for route, operations in spec["paths"].items():
        if route.endswith("/remix"):
            continue  # declared, not implemented: 501 whatever it is sent
        url = omni_server.base_url + route.replace("{video_id}", escaped)
        for method in operations:
            response = httpx.request(
                method.upper(),
                f"{url}?after={escaped}&limit={escaped}&variant={escaped}",
                headers=omni_server.headers(),
                timeout=30,
            )
            assert response.status_code < 500, (method, route, response.text)
            if response.status_code >= 400:
                assert_canonical_error(
                    response.status_code, response.json(), response.headers
                )


# -- realtime events -------------------------------------------------------------


def _events(text: str) -> list[tuple[dict[str, Any], str | None]]:
    """(event, param) for a surrogate in every string of ``response.create``."""
    valid = {"instructions": "hi", "modalities": ["text"], "voice": "alloy"}
    return [
        ({"type": text, "response": valid}, "type"),
        ({"type": "response.create", "response": {**valid, "instructions": text}},
         "response.instructions"),
        ({"type": "response.create",
          "response": {**valid, "modalities": [text]}}, "response.modalities.0"),
        ({"type": "response.create", "response": {**valid, "voice": text}},
         "response.voice"),
        ({"type": "response.create", "response": valid, "extra": text}, "extra"),
        ({"type": "response.create", "response": {**valid, text: 1}}, "response"),
        ({"type": "response.create", "response": valid, text: 1}, "event"),
    ]  # fmt: skip


def _recv(ws: ClientConnection) -> dict[str, Any]:
    event = json.loads(ws.recv(timeout=10))
    assert isinstance(event, dict)
    return event


def _ws_url(server: OmniServer) -> str:
    return server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"


def test_realtime_events(omni_server: OmniServer) -> None:
    before = metric_samples(omni_server.base_url)
    sent = 0
    with connect(_ws_url(omni_server), additional_headers=omni_server.headers()) as ws:
        assert _recv(ws)["type"] == "session.created"
        for name, text in SURROGATES.items():
            for index, (event, param) in enumerate(_events(text)):
                event_id = f"e-{name.replace(' ', '-')}-{index}"
                ws.send(json.dumps({**event, "event_id": event_id}))
                sent += 1
                reply = _recv(ws)
                assert reply["type"] == "error", reply
                assert reply["event_id"] == event_id
                error = reply["error"]
                assert (error["code"], error["type"], error["param"]) == (
                    400,
                    "BadRequestError",
                    param,
                ), reply
            # An event_id that is not Unicode is not echoed; it is the field.
            ws.send(json.dumps({"type": "response.create", "event_id": text}))
            sent += 1
            reply = _recv(ws)
            assert "event_id" not in reply
            assert reply["error"]["param"] == "event_id"
        # The session goes on: a valid response still streams to its end.
        ws.send(
            json.dumps({"type": "response.create", "response": {"instructions": "hi"}})
        )
        kinds = []
        while not kinds or kinds[-1] != "response.done":
            kinds.append(_recv(ws)["type"])
        assert kinds[0] == "response.created"
    after = settled_samples(
        omni_server.base_url,
        before,
        ERRORS,
        sent,
        transport="websocket",
        category="client",
    )
    assert (
        sample_delta(
            before,
            after,
            ERRORS,
            transport="websocket",
            category="client",
            type="BadRequestError",
            code="400",
        )
        == sent
    )
    assert sample_delta(before, after, ERRORS, category="server") == 0
