"""Retry guidance in the renderers (docs/design.md §10): one decision per record,
``x-should-retry`` (with ``Retry-After`` when ``true``) on HTTP responses and
denied WebSocket handshakes, ``retryable`` in the error objects of
transports without headers (SSE after 200, WebSocket events, stored jobs).

The endpoint tests (``tests/e2e/test_retry_guidance.py``) drive the same
decision through the OpenAI SDK; here every transport's renderer is checked
for every kind of record, including records no route raises today.
"""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.http.schema import component_schemas
from vllm_omni.errors.render import (
    error_body,
    error_object,
    http_error_response,
    job_error,
    sse_error_events,
    websocket_denial,
    ws_error_event,
)


def _record(
    category: str, status: int, *, fatal: bool = False, request_id: str = "req-1"
) -> OmniErrorDetails:
    return OmniErrorDetails(
        "message",
        category,  # type: ignore[arg-type]
        status,
        "SomeError",
        request_id=request_id,
        stage_id=2 if category == "server" else None,
        fatal=fatal,
    )


# (category, status, fatal) -> x-should-retry
RULE: dict[tuple[str, int, bool], bool] = {
    ("client", 400, False): False,
    ("client", 401, False): False,
    ("client", 404, False): False,
    ("client", 405, False): False,
    ("client", 408, False): True,
    ("client", 409, False): False,
    ("client", 413, False): False,
    ("client", 422, False): False,
    ("client", 429, False): True,
    ("server", 500, False): True,
    ("server", 500, True): False,
    ("server", 501, False): False,
    ("server", 502, False): True,
    ("server", 503, False): True,
    ("server", 503, True): False,
    ("server", 504, False): True,
}


def _raw_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode(), value.decode()) for name, value in headers]


@pytest.mark.parametrize(("category", "status", "fatal"), sorted(RULE))
def test_http_headers_follow_the_rule(category: str, status: int, fatal: bool) -> None:
    response = http_error_response(_record(category, status, fatal=fatal))
    headers = _raw_headers(response.raw_headers)
    names = [name for name, _ in headers]
    assert names.count("x-should-retry") == 1
    assert names.count("x-request-id") == 1
    retry = RULE[(category, status, fatal)]
    assert ("x-should-retry", str(retry).lower()) in headers
    if retry:
        assert ("retry-after", "1") in headers
    else:
        assert "retry-after" not in names
    assert response.status_code == status
    assert json.loads(response.body)["error"] == error_object(
        _record(category, status, fatal=fatal)
    )


@pytest.mark.parametrize(("category", "status", "fatal"), sorted(RULE))
def test_bodies_without_headers_carry_retryable(
    category: str, status: int, fatal: bool
) -> None:
    record = _record(category, status, fatal=fatal)
    expected = {**error_object(record), "retryable": RULE[(category, status, fatal)]}
    assert ws_error_event(record) == {"type": "error", "error": expected}
    assert ws_error_event(record, event_id="e1") == {
        "type": "error",
        "error": expected,
        "event_id": "e1",
    }
    assert job_error(record) == expected
    frames = sse_error_events(record).split(b"\n\n")
    assert frames == [
        b"data: " + json.dumps({"error": expected}, separators=(",", ":")).encode(),
        b"data: [DONE]",
        b"",
    ]


@pytest.mark.parametrize(("category", "status", "fatal"), sorted(RULE))
def test_denied_handshake_headers(category: str, status: int, fatal: bool) -> None:
    start, body = websocket_denial(
        _record(category, status, fatal=fatal), with_body=True
    )
    headers = _raw_headers(start["headers"])
    retry = RULE[(category, status, fatal)]
    assert ("x-should-retry", str(retry).lower()) in headers
    assert (("retry-after", "1") in headers) is retry
    assert [name for name, _ in headers].count("x-request-id") == 1
    assert json.loads(body["body"]) == {
        "error": error_object(_record(category, status, fatal=fatal))
    }
    # Without the extension only a close frame can be sent: no headers at all.
    assert websocket_denial(_record(category, status, fatal=fatal), with_body=False)[
        0
    ].keys() == {"type", "code"}


@pytest.mark.parametrize(
    ("category", "status"), [("server", 503), ("server", 500), ("client", 400)]
)
def test_a_replayed_record_is_final(category: str, status: int) -> None:
    """A stored job error read back: a repeat reads the same record again."""
    response = http_error_response(_record(category, status), replayed=True)
    headers = _raw_headers(response.raw_headers)
    assert ("x-should-retry", "false") in headers
    assert "retry-after" not in [name for name, _ in headers]
    assert response.status_code == status


def test_no_request_id_header_without_an_id() -> None:
    record = OmniErrorDetails("m", "client", 400, "BadRequestError")
    names = [name for name, _ in _raw_headers(http_error_response(record).raw_headers)]
    assert "x-request-id" not in names
    assert names.count("x-should-retry") == 1


_RECORDS = st.one_of(
    st.builds(
        OmniErrorDetails,
        message=st.just("m"),
        category=st.just("client"),
        status_code=st.integers(400, 499),
        error_type=st.just("T"),
    ),
    st.builds(
        OmniErrorDetails,
        message=st.just("m"),
        category=st.just("server"),
        status_code=st.integers(500, 599),
        error_type=st.just("T"),
        fatal=st.booleans(),
    ),
)


@given(_RECORDS)
def test_retry_after_exactly_when_retry(record: OmniErrorDetails) -> None:
    headers = dict(_raw_headers(http_error_response(record).raw_headers))
    retry = headers["x-should-retry"]
    assert retry in ("true", "false")
    assert ("retry-after" in headers) is (retry == "true")
    assert job_error(record)["retryable"] is (retry == "true")
    if record.fatal or (
        record.category == "client" and record.status_code not in (408, 429)
    ):
        assert retry == "false"


def _validator(name: str) -> jsonschema_rs.Validator:
    """The published schema ``name`` (``/openapi.json``'s components)."""
    root = {"$ref": f"#/components/schemas/{name}"}
    return jsonschema_rs.Draft202012Validator(
        {**root, "components": {"schemas": component_schemas()}}
    )


_IDS = st.one_of(st.none(), st.from_regex(r"\Achatcmpl-[0-9a-f]{1,16}\Z"))
_ANY_RECORDS = st.sampled_from([("client", 400, 499), ("server", 500, 599)]).flatmap(
    lambda owner: st.builds(
        OmniErrorDetails,
        message=st.sampled_from(["Bad value.", "The stage failed.", "m"]),
        category=st.just(owner[0]),
        status_code=st.integers(owner[1], owner[2]),
        error_type=st.sampled_from(["BadRequestError", "InternalServerError"]),
        parameter=st.one_of(st.none(), st.from_regex(r"\A[a-z_]{1,8}\Z")),
        request_id=_IDS,
        stage_id=st.one_of(st.none(), st.integers(0, 9)),
        fatal=st.just(False) if owner[0] == "client" else st.booleans(),
    )
)


@given(_ANY_RECORDS)
def test_every_rendered_error_is_the_published_schema(
    record: OmniErrorDetails,
) -> None:
    http = _validator("ErrorEnvelope")
    event = _validator("ErrorEventEnvelope")
    assert http.is_valid(json.loads(http_error_response(record).body))
    sse = json.loads(sse_error_events(record).split(b"\n\n")[0].removeprefix(b"data: "))
    assert event.is_valid(sse)
    assert event.is_valid({"error": ws_error_event(record)["error"]})
    assert event.is_valid({"error": job_error(record)})
    # Each schema refuses the other's shape: the retry guidance is where it
    # belongs, in the body only where no header can carry it.
    assert not http.is_valid(sse) and not event.is_valid(error_body(record))


def test_the_published_event_object_is_the_http_one_plus_retryable() -> None:
    schemas = component_schemas()
    http, event = schemas["ErrorObject"], schemas["ErrorEventObject"]
    assert set(event["properties"]) - set(http["properties"]) == {"retryable"}
    assert set(event["required"]) - set(http["required"]) == {"retryable"}
    assert http["additionalProperties"] is event["additionalProperties"] is False
