"""Contract fuzzing of the real server with schemathesis, from its own OpenAPI.

Bounded examples per operation. Every response must be one the document
declares (status, content type, schema), no malformed input may produce a
5xx, every error body must be the canonical envelope with ``code == status``,
and the document says what the server accepts: a request it admits is not a
4xx, one it does not admit is (schemathesis' positive- and negative-data
checks). An uploaded image is one of the types the document names, drawn
by the strategies registered here for them. Hypothesis, used directly, also
sends what the document cannot describe: hostile image bytes in multipart
edits (422 on ``image``, never 5xx) and malformed realtime WebSocket events
(one error event each, and the session goes on).
"""

from __future__ import annotations

import copy
import io
import json
import struct
import zlib
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qs

import httpx
import jsonschema_rs
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from PIL import Image
from schemathesis import APIOperation, Case, GenerationMode, checks
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.errors import FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData
from websockets.sync.client import ClientConnection, connect

from tests.e2e.canonical import assert_canonical_error, assert_canonical_event_error
from tests.e2e.omni_server import OmniServer
from vllm_omni.entrypoints.openai.openapi import IMAGE_TYPES

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.positive_data_acceptance,
    checks.negative_data_rejection,
]


def _encoded(kind: str, width: int, height: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((width, height), 32 + seed % 64).convert("RGB").save(
        buffer, kind
    )
    return buffer.getvalue()


# The document says an edit's image is a PNG, JPEG, GIF or WebP file: these
# make such files (schemathesis' documented hook for a media type).
for _media_type in IMAGE_TYPES:
    schemathesis.openapi.media_type(
        _media_type,
        st.builds(
            _encoded,
            st.just(_media_type.split("/")[1].upper()),
            st.integers(1, 48),
            st.integers(1, 48),
            st.integers(0, 255),
        ),
    )


# A form's ``sampling_params_list`` is JSON text (``format: json``): drawn as
# lists of per-stage entries the reference pipeline honours.
schemathesis.openapi.format(
    "json",
    st.sampled_from(
        [
            "[]",
            "null",
            "[null]",
            '[null, {"max_tokens": 2}]',
            '[{}, null, {"voice": "echo"}, null, {"seed": 3}, {"fps": 4}]',
        ]
    ),
)


def _operations(omni_server: OmniServer) -> list[APIOperation]:
    schema = schemathesis.openapi.from_url(
        omni_server.base_url + "/openapi.json", headers=omni_server.headers()
    )
    return [result.ok() for result in schema.get_all_operations()]


def _check_operation(operation: APIOperation, omni_server: OmniServer) -> None:
    # Remix is declared but not implemented: 501 is its one documented answer.
    declared_5xx = operation.path.endswith("/remix")
    checks_for_operation = CHECKS[1:] if declared_5xx else CHECKS

    # Valid and invalid inputs, as schemathesis' own runner mixes them; an
    # operation with nothing to make invalid draws only valid cases.
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @settings(
        max_examples=24,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Case) -> None:
        response = case.call(
            base_url=omni_server.base_url, headers=omni_server.headers(), timeout=60
        )
        _read_back_as_sent(case, response)
        _cancel_created_job(operation, response, omni_server)
        case.validate_response(response, checks=checks_for_operation)
        if response.status_code >= 400:
            assert_canonical_error(
                response.status_code, response.json(), response.headers
            )

    run()


def _cancel_created_job(
    operation: APIOperation, response: requests.Response, omni_server: OmniServer
) -> None:
    """A video job the fuzz created is cancelled at once: its answer is what
    is checked, and jobs left running would load the shared server."""
    if operation.label == "POST /v1/videos" and response.status_code == 200:
        cancelled = httpx.delete(
            f"{omni_server.base_url}/v1/videos/{response.json()['id']}",
            headers=omni_server.headers(),
            timeout=60,
        )
        assert cancelled.status_code == 200, cancelled.text


def _read_back_as_sent(case: Case, response: requests.Response) -> None:
    """Make a form case's body the fields the request carried, as the server
    reads them: the text of each field (the last, when repeated), a file part
    as the string the document declares it as (``contentMediaType``).

    Schemathesis judges a negative form case by the fields as sent (a JSON
    number in a form is the text ``5``, which a text field accepts), but
    pairs them with the generated body by name, which multipart escaping
    breaks (a name with a line break or a quote), and its validator raises
    on a file's bytes: either way (schemathesis 4.32.5) a form the server
    rightly accepts counts as accepted invalid data.
    """
    content_type = response.request.headers.get("Content-Type", "")
    body = response.request.body
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes) or not isinstance(case.body, dict):
        return
    if content_type.startswith("application/x-www-form-urlencoded"):
        fields = parse_qs(body.decode("ascii", "replace"), keep_blank_values=True)
        case.body = {name: values[-1] for name, values in fields.items()}
    elif content_type.startswith("multipart/form-data"):
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + body
        )
        sent: dict[str, Any] = {}
        for part in message.iter_parts():
            name = str(part.get_param("name", header="content-disposition"))
            payload = part.get_payload(decode=True)
            if part.get_filename() is not None:
                sent[name] = "<file>"
            elif isinstance(payload, bytes):
                sent[name] = payload.decode(errors="replace")
        case.body = sent


def test_openapi_contract(omni_server: OmniServer, subtests: Any) -> None:
    """Every operation of the server's own OpenAPI, valid and invalid inputs.

    Driven through schemathesis' public API (``as_strategy`` under hypothesis'
    ``@given``), not its pytest plugin, which reads private pytest internals.
    """
    operations = _operations(omni_server)
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:
        with subtests.test(operation=operation.label):
            _check_operation(operation, omni_server)


def _planted(
    omni_server: OmniServer, maximum: float
) -> tuple[APIOperation, jsonschema_rs.Validator, jsonschema_rs.Validator]:
    """The speech operation of the served document with another ``speed``
    maximum than the server's, and validators of the served and planted
    request bodies."""
    served = httpx.get(
        omni_server.base_url + "/openapi.json", headers=omni_server.headers()
    ).json()
    planted = copy.deepcopy(served)
    planted["paths"] = {"/v1/audio/speech": planted["paths"]["/v1/audio/speech"]}
    speech = planted["components"]["schemas"]["SpeechRequest"]
    speech["properties"]["speed"]["anyOf"][0]["maximum"] = maximum
    # Only the fields a request needs and the planted one: with every other
    # field of the route to mutate, negative data that breaks the bound
    # alone is too rare for the search to meet.
    kept = {"input", "voice", "speed"}
    speech["properties"] = {
        name: schema for name, schema in speech["properties"].items() if name in kept
    }
    speech["required"] = [name for name in speech.get("required", []) if name in kept]
    validators = tuple(
        jsonschema_rs.Draft202012Validator(
            {
                "$ref": "#/components/schemas/SpeechRequest",
                "components": document["components"],
            }
        )
        for document in (served, planted)
    )
    operation = schemathesis.openapi.from_dict(planted)["/v1/audio/speech"]["POST"]
    return operation, *validators


@pytest.mark.parametrize(
    ("maximum", "mode", "check", "failure"),
    [
        # Looser than the server: a request it admits is refused.
        (
            8.0,
            GenerationMode.POSITIVE,
            checks.positive_data_acceptance,
            RejectedPositiveData,
        ),
        # Stricter than the server: a request it does not admit is honoured
        # (a wide gap: negative data above a maximum is often far above it).
        (
            0.3,
            GenerationMode.NEGATIVE,
            checks.negative_data_rejection,
            AcceptedNegativeData,
        ),
    ],
    ids=["looser", "stricter"],
)
def test_a_planted_gap_between_document_and_server_is_caught(
    omni_server: OmniServer,
    maximum: float,
    mode: GenerationMode,
    check: Any,
    failure: type[Exception],
) -> None:
    """The positive- and negative-data checks fail where the document and
    the server disagree (here on one bound)."""
    operation, served, planted = _planted(omni_server, maximum)

    def disagree(case: Case) -> bool:
        body = case.body
        return isinstance(body, dict) and served.is_valid(body) != planted.is_valid(
            body
        )

    case = find(
        operation.as_strategy(generation_mode=mode),
        disagree,
        settings=settings(
            # Negative data that breaks the one planted bound and nothing
            # else is rare (about one body in 200).
            max_examples=5000,
            derandomize=True,
            database=None,
            # The first such request is the point, not the simplest one.
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )
    response = case.call(
        base_url=omni_server.base_url, headers=omni_server.headers(), timeout=60
    )
    with pytest.raises(FailureGroup) as caught:
        case.validate_response(response, checks=[check])
    assert [type(error) for error in caught.value.exceptions] == [failure]


def test_planted_non_canonical_body_is_caught() -> None:
    """The canonical check fails on what a route building its own error returns."""
    planted = requests.models.Response()
    planted.status_code = 400
    planted._content = b'{"detail": "temperature out of range"}'
    with pytest.raises(AssertionError):
        assert_canonical_error(400, planted.json())
    with pytest.raises(AssertionError):
        assert_canonical_error(
            200,
            {
                "error": {
                    "message": "x",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
        )


# -- hypothesis, directly: multipart image edits and the realtime WebSocket ------
#
# The OpenAPI document cannot describe what matters here (the bytes inside an
# uploaded image, the events inside a WebSocket), so these generate them.


def _seed_images() -> list[bytes]:
    images = []
    for kind in ("PNG", "GIF", "JPEG", "BMP", "PPM", "WEBP"):
        buffer = io.BytesIO()
        Image.effect_noise((24, 24), 64).convert("RGB").save(buffer, kind)
        images.append(buffer.getvalue())
    return images


SEED_IMAGES = _seed_images()


def _with_dimensions(png: bytes, width: int, height: int) -> bytes:
    """``png`` whose IHDR claims another size, with a valid CRC."""
    ihdr = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    return png[:8] + png[8:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


@st.composite
def hostile_images(draw: st.DrawFn) -> bytes:
    """Corrupt, truncated, lying-about-their-size or plain random uploads."""
    kind = draw(st.sampled_from(["truncated", "flipped", "dimensions", "random"]))
    seed = draw(st.sampled_from(SEED_IMAGES))
    if kind == "truncated":
        return seed[: draw(st.integers(0, len(seed) - 1))]
    if kind == "flipped":
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "dimensions":
        side = st.integers(0, 2**31 - 1)
        return _with_dimensions(SEED_IMAGES[0], draw(side), draw(side))
    return draw(st.binary(max_size=512))


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(image=hostile_images())
def test_image_edits_never_answer_5xx(omni_server: OmniServer, image: bytes) -> None:
    response = httpx.post(
        omni_server.base_url + "/v1/images/edits",
        headers=omni_server.headers(),
        files={"image": ("fuzz.png", image, "image/png")},
        data={"prompt": "fuzz", "size": "64x64"},
        timeout=60,
    )
    assert response.status_code in (200, 400, 422), response.text[:500]
    if response.status_code != 200:
        body = response.json()
        assert_canonical_error(response.status_code, body, response.headers)
        if response.status_code == 422:
            assert body["error"]["param"] == "image"


_EVENT_IDS = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True),
    st.text(max_size=12),
    st.integers(),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
_BAD_RESPONSES = st.one_of(
    _JSON.filter(lambda value: not isinstance(value, dict)),
    st.fixed_dictionaries(
        {"instructions": st.one_of(st.just(""), st.just("  \n"), st.integers())}
    ),
    st.fixed_dictionaries(
        {
            "instructions": st.just("hi"),
            "modalities": st.one_of(
                st.just([]), st.just(["video"]), st.just(["audio"]), _JSON
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "instructions": st.just("hi"),
            "max_tokens": st.one_of(st.text(max_size=4), st.just(2**70), st.booleans()),
        }
    ),
)


def _event(kind: st.SearchStrategy[Any], response: st.SearchStrategy[Any]) -> Any:
    return st.fixed_dictionaries(
        {"type": kind, "response": response}, optional={"event_id": _EVENT_IDS}
    ).map(json.dumps)


MALFORMED_EVENTS = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=64),
    _JSON.map(json.dumps),
    _event(
        st.one_of(
            st.text(max_size=30).filter(lambda kind: kind != "response.create"),
            st.integers(),
            st.none(),
        ),
        _JSON,
    ),
    _event(st.just("response.create"), _BAD_RESPONSES),
)


@pytest.fixture(scope="module")
def realtime(omni_server: OmniServer) -> Iterator[ClientConnection]:
    """One session for every example: a malformed event must not end it."""
    url = omni_server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"
    with connect(url, additional_headers=omni_server.headers()) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        yield ws


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(frame=MALFORMED_EVENTS)
def test_malformed_realtime_events_get_one_error_event(
    realtime: ClientConnection, frame: str | bytes
) -> None:
    realtime.send(frame)
    event = json.loads(realtime.recv(timeout=30))
    assert event["type"] == "error", event
    error = event["error"]
    assert_canonical_event_error(400, error)
    assert error["type"] == "BadRequestError"
    assert error["retryable"] is False
    sent = json.loads(frame) if isinstance(frame, str) and _is_object(frame) else {}
    if "event_id" in event:
        assert event["event_id"] == sent.get("event_id")


def _is_object(frame: str) -> bool:
    try:
        return isinstance(json.loads(frame), dict)
    except (ValueError, RecursionError):
        return False
