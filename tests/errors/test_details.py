"""``OmniErrorDetails`` (docs/design.md §3): invariants at construction, the wire form,
the tolerant reader, and the promise that the record is cheap to import."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni.errors.details import (
    GENERIC_SERVER_MESSAGE,
    LEGACY_WIRE_FIELDS,
    WIRE_FIELDS,
    OmniErrorDetails,
)
from vllm_omni.errors.sanitize import sanitize_message

GENERIC = "The server had an error while processing your request."
SAFE_500 = OmniErrorDetails(GENERIC, "server", 500, "InternalServerError")
LEGACY_KEYS = {"error", "status_code", "error_type", "fatal", "request_id", "stage_id"}
FULL_KEYS = LEGACY_KEYS | {
    "message",
    "category",
    "parameter",
    "faulted",
    "retry_after_s",
}


def test_generic_message() -> None:
    assert GENERIC_SERVER_MESSAGE == GENERIC


def test_field_lists() -> None:
    assert set(WIRE_FIELDS) == {f.name for f in dataclasses.fields(OmniErrorDetails)}
    assert set(LEGACY_WIRE_FIELDS) == LEGACY_KEYS


# -- invariants ------------------------------------------------------------------

VALID = {
    "message": "bad",
    "category": "client",
    "status_code": 400,
    "error_type": "BadRequestError",
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"status_code": 503}, "a client error needs a status"),
        ({"status_code": 399}, "a client error needs a status"),
        ({"category": "server", "status_code": 404}, "a server error needs a status"),
        ({"category": "server", "status_code": 600}, "a server error needs a status"),
        ({"category": "CLIENT"}, "category must be 'client' or 'server'"),
        ({"category": None}, "category must be 'client' or 'server'"),
        ({"status_code": "400"}, "a client error needs a status"),
        ({"status_code": 400.0}, "a client error needs a status"),
        ({"status_code": True}, "a client error needs a status"),
        ({"fatal": True}, "fatal must be a bool and only a server error can be fatal"),
        (
            {"category": "server", "status_code": 500, "fatal": 1},
            "fatal must be a bool",
        ),
        ({"error_type": ""}, "error_type must be a short identifier"),
        ({"error_type": "Bad\nRequest"}, "error_type must be a short identifier"),
        ({"error_type": "<script>"}, "error_type must be a short identifier"),
        ({"error_type": "E" * 65}, "error_type must be a short identifier"),
        ({"error_type": None}, "error_type must be a short identifier"),
        ({"message": "see /home/alice/x.py"}, "message must be sanitized text"),
        ({"message": " padded "}, "message must be sanitized text"),
        ({"message": "x" * 1025}, "message must be sanitized text"),
        ({"message": b"bytes"}, "message must be sanitized text"),
        ({"message": ""}, "message must not be empty"),
        ({"parameter": "bad param"}, "parameter must be a plain field path"),
        ({"parameter": "1st"}, "parameter must be a plain field path"),
        ({"parameter": "p" * 129}, "parameter must be a plain field path"),
        ({"request_id": "has space"}, "request_id must be a short token"),
        ({"request_id": ""}, "request_id must be a short token"),
        ({"stage_id": -1}, "stage_id must be an int from 0 to 2147483647"),
        ({"stage_id": True}, "stage_id must be an int from 0 to 2147483647"),
        ({"stage_id": "0"}, "stage_id must be an int from 0 to 2147483647"),
        ({"stage_id": 2**31}, "stage_id must be an int from 0 to 2147483647"),
        ({"faulted": True}, "faulted must be a bool and only a nonfatal server 503"),
        (
            {"category": "server", "status_code": 500, "faulted": True},
            "faulted must be a bool and only a nonfatal server 503",
        ),
        (
            {"category": "server", "status_code": 503, "faulted": True, "fatal": True},
            "faulted must be a bool and only a nonfatal server 503",
        ),
        (
            {"category": "server", "status_code": 503, "faulted": 1},
            "faulted must be a bool",
        ),
        ({"retry_after_s": 0}, "retry_after_s must be an int from 1 to 3600"),
        ({"retry_after_s": 3601}, "retry_after_s must be an int from 1 to 3600"),
        ({"retry_after_s": 1.5}, "retry_after_s must be an int from 1 to 3600"),
        ({"retry_after_s": True}, "retry_after_s must be an int from 1 to 3600"),
    ],
)
def test_invariant_violation_is_a_runtime_error(
    change: dict[str, Any], problem: str
) -> None:
    with pytest.raises(RuntimeError, match=f"^invalid OmniErrorDetails: {problem}"):
        OmniErrorDetails(**(VALID | change))


def test_invariant_violation_is_not_a_value_error() -> None:
    # A ValueError could be turned into a 400 by a legacy fallback.
    with pytest.raises(RuntimeError) as info:
        OmniErrorDetails("x", "client", 503, "ServiceUnavailableError")
    assert not isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "fields",
    [
        VALID,
        VALID | {"status_code": 499, "parameter": "messages.0.content"},
        VALID | {"error_type": "Too Many Requests", "status_code": 429},
        {
            "message": GENERIC,
            "category": "server",
            "status_code": 599,
            "error_type": "InternalServerError",
            "request_id": "chatcmpl-1:a.b_c",
            "stage_id": 0,
            "fatal": True,
        },
        VALID | {"message": "word " * 204 + "wor…"},
    ],
)
def test_valid_records(fields: dict[str, Any]) -> None:
    record = OmniErrorDetails(**fields)
    assert (
        dataclasses.asdict(record)
        == {
            "parameter": None,
            "request_id": None,
            "stage_id": None,
            "fatal": False,
            "faulted": False,
            "retry_after_s": None,
        }
        | fields
    )


def test_record_is_frozen_and_slotted() -> None:
    record = OmniErrorDetails(**VALID)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status_code = 500  # type: ignore[misc]
    assert not hasattr(record, "__dict__")
    assert record.is_client is True
    assert SAFE_500.is_client is False


# -- wire form -------------------------------------------------------------------

RECORD = OmniErrorDetails(
    "Voice 'zz' is unknown",
    "client",
    404,
    "NotFoundError",
    parameter="voice",
    request_id="speech-7",
    stage_id=1,
)


def test_to_wire() -> None:
    assert RECORD.to_wire() == {
        "message": "Voice 'zz' is unknown",
        "category": "client",
        "status_code": 404,
        "error_type": "NotFoundError",
        "parameter": "voice",
        "request_id": "speech-7",
        "stage_id": 1,
        "fatal": False,
        "faulted": False,
        "retry_after_s": None,
        "error": "Voice 'zz' is unknown",
    }


def test_to_wire_legacy_has_exactly_the_legacy_keys() -> None:
    assert RECORD.to_wire(legacy=True) == {
        "error": "Voice 'zz' is unknown",
        "status_code": 404,
        "error_type": "NotFoundError",
        "fatal": False,
        "request_id": "speech-7",
        "stage_id": 1,
    }


@pytest.mark.parametrize(
    ("legacy", "expected"),
    [
        (
            {
                "error": "no such voice",
                "status_code": 404,
                "error_type": "NotFoundError",
            },
            OmniErrorDetails("no such voice", "client", 404, "NotFoundError"),
        ),
        (
            {
                "error": "stage crashed",
                "status_code": 500,
                "error_type": "InternalServerError",
                "fatal": True,
                "request_id": "r-1",
                "stage_id": 2,
            },
            OmniErrorDetails(
                # A 0.30 fatal text is the log text of the death (issue 22).
                GENERIC,
                "server",
                500,
                "InternalServerError",
                request_id="r-1",
                stage_id=2,
                fatal=True,
            ),
        ),
        (
            {"error": "busy", "status_code": 503},
            OmniErrorDetails("busy", "server", 503, "ServiceUnavailableError"),
        ),
        (
            {"error": "too big", "status_code": 413, "error_type": None},
            OmniErrorDetails("too big", "client", 413, "RequestTooLargeError"),
        ),
        (
            {"error": "at /opt/app/x.py", "status_code": 422, "extra": [1, 2]},
            OmniErrorDetails("at <path>", "client", 422, "UnprocessableEntityError"),
        ),
    ],
    ids=["4xx", "5xx-fatal", "5xx-no-type", "4xx-null-type", "unknown-key"],
)
def test_legacy_record_is_read_by_status(
    legacy: dict[str, Any], expected: OmniErrorDetails
) -> None:
    assert OmniErrorDetails.from_wire(legacy) == expected


@pytest.mark.parametrize(
    "malformed",
    [
        {},
        {"error": "x"},
        {"error": "x", "status_code": "404"},
        {"error": "x", "status_code": 200},
        {"error": "x", "status_code": 302, "category": None},
        {"error": "x", "status_code": 404, "category": "server"},
        {"error": "x", "status_code": 503, "category": "client"},
        {"error": "x", "status_code": 500, "fatal": "yes"},
        {"error": 7, "status_code": 500},
        {"message": "x", "status_code": 404, "category": "Client"},
    ],
)
def test_malformed_record_becomes_a_safe_500(malformed: dict[str, Any]) -> None:
    assert OmniErrorDetails.from_wire(malformed) == SAFE_500
    with_ids = malformed | {"request_id": "r-2", "stage_id": 3}
    assert OmniErrorDetails.from_wire(with_ids) == dataclasses.replace(
        SAFE_500, request_id="r-2", stage_id=3
    )


@pytest.mark.parametrize(
    "fatal",
    [
        # How 0.30 wrote a dead engine: no status, no type (issue 22).
        {"error": "stage engine died", "fatal": True},
        {"error": "x", "status_code": None, "error_type": None, "fatal": True},
        {"error": "x", "status_code": 400, "fatal": True},
        {"message": "x", "category": "client", "status_code": 400, "fatal": True},
        {"error": "x", "status_code": "500", "fatal": True},
    ],
)
def test_a_fatal_record_is_never_read_as_nonfatal(fatal: dict[str, Any]) -> None:
    """Whatever else it says, a fatal record is a fatal server 500 of its
    stage: the receiver marks the engine dead, not one request failed."""
    with_ids = fatal | {"request_id": "r-3", "stage_id": 1}
    assert OmniErrorDetails.from_wire(with_ids) == dataclasses.replace(
        SAFE_500, request_id="r-3", stage_id=1, fatal=True
    )


def test_a_fatal_record_keeps_its_5xx() -> None:
    assert OmniErrorDetails.from_wire(
        {"error": "drained", "status_code": 503, "fatal": True, "stage_id": 2}
    ) == OmniErrorDetails(
        GENERIC, "server", 503, "ServiceUnavailableError", stage_id=2, fatal=True
    )


@pytest.mark.parametrize(
    "not_a_dict", [None, [], "error", 404, b"{}", ("status_code", 400)]
)
def test_non_dict_becomes_a_safe_500(not_a_dict: Any) -> None:
    assert OmniErrorDetails.from_wire(not_a_dict) == SAFE_500


def test_reader_sanitizes_and_drops_unsafe_fields() -> None:
    record = OmniErrorDetails.from_wire(
        {
            "message": "token=abc at C:\\srv\\app.py\x00",
            "category": "client",
            "status_code": 400,
            "error_type": "Bad\nType",
            "parameter": "a b",
            "request_id": "not safe",
            "stage_id": -4,
        }
    )
    assert record == OmniErrorDetails(
        "token=<redacted> at <path>", "client", 400, "BadRequestError"
    )


class _HostileKey:
    """Collides with "request_id" and raises when compared."""

    def __hash__(self) -> int:
        return hash("request_id")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("compared")


def test_reader_survives_a_key_that_raises() -> None:
    assert OmniErrorDetails.from_wire({_HostileKey(): 1}) == SAFE_500


# -- properties --------------------------------------------------------------------

SECRETS = st.sampled_from(
    [
        "sk-proj-abcdef123456",
        "hf_abcdefghijklmnop",
        "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x",
        "password=hunter2",
        "/home/alice/.cache/x.bin",
        "C:\\Users\\bob\\a.txt",
        'File "/srv/app.py", line 3, in main',
        "0x7ffde3a0b1c0",
        "data:audio/wav;base64,UklGRiQAAABXQVZFZm10",
        "\x07\u202e",
    ]
)
MESSAGES = (
    st.one_of(
        st.text(max_size=120),
        st.lists(st.one_of(SECRETS, st.text(max_size=10)), max_size=5).map(" ".join),
        st.text(min_size=1000, max_size=1500),
    )
    .map(sanitize_message)
    .filter(bool)
)
ERROR_TYPES = st.from_regex(r"[A-Za-z][A-Za-z0-9 _.-]{0,63}", fullmatch=True)
PARAMETERS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\[\]-]{0,127}", fullmatch=True)
REQUEST_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", fullmatch=True)


@st.composite
def records(draw: st.DrawFn) -> OmniErrorDetails:
    category = draw(st.sampled_from(["client", "server"]))
    low = 400 if category == "client" else 500
    status = draw(st.integers(low, low + 99) | st.just(low + 3))
    fatal = category == "server" and draw(st.booleans())
    return OmniErrorDetails(
        message=draw(MESSAGES),
        category=category,
        status_code=status,
        error_type=draw(ERROR_TYPES),
        parameter=draw(st.none() | PARAMETERS),
        request_id=draw(st.none() | REQUEST_IDS),
        stage_id=draw(st.none() | st.integers(0, 2**31 - 1)),
        fatal=fatal,
        faulted=status == 503 and not fatal and draw(st.booleans()),
        retry_after_s=draw(st.none() | st.integers(1, 3600)),
    )


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@SETTINGS
@given(records())
def test_wire_round_trip(record: OmniErrorDetails) -> None:
    wire = record.to_wire()
    assert set(wire) == FULL_KEYS
    assert OmniErrorDetails.from_wire(wire) == record
    assert OmniErrorDetails.from_wire(json.loads(json.dumps(wire))) == record
    packed = msgspec.msgpack.decode(msgspec.msgpack.encode(wire))
    assert OmniErrorDetails.from_wire(packed) == record


@SETTINGS
@given(records())
def test_legacy_wire_round_trip(record: OmniErrorDetails) -> None:
    legacy = record.to_wire(legacy=True)
    assert set(legacy) == LEGACY_KEYS
    # A 0.30 receiver loses only what it never had: the parameter, the
    # faulted mark and the retry delay; and a fatal record's text is, to
    # 0.30, the log text of the death (issue 22).
    assert OmniErrorDetails.from_wire(legacy) == dataclasses.replace(
        record,
        parameter=None,
        faulted=False,
        retry_after_s=None,
        message=GENERIC if record.fatal else record.message,
    )


JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8)
    | SECRETS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = st.one_of(st.sampled_from(sorted(FULL_KEYS)), st.text(max_size=8))
PLAUSIBLE = st.fixed_dictionaries(
    {},
    optional={
        "message": st.one_of(MESSAGES, SECRETS, JSONISH),
        "error": st.one_of(MESSAGES, SECRETS, JSONISH),
        "category": st.one_of(st.sampled_from(["client", "server", "CLIENT"]), JSONISH),
        "status_code": st.one_of(st.integers(0, 1000), JSONISH),
        "error_type": st.one_of(ERROR_TYPES, JSONISH),
        "parameter": st.one_of(PARAMETERS, JSONISH),
        "request_id": st.one_of(REQUEST_IDS, JSONISH),
        "stage_id": st.one_of(st.integers(-2, 2**40), JSONISH),
        "fatal": st.one_of(st.booleans(), JSONISH),
        "faulted": st.one_of(st.booleans(), JSONISH),
        "retry_after_s": st.one_of(st.integers(-1, 4000), JSONISH),
    },
)


@SETTINGS
@given(st.one_of(st.dictionaries(KEYS, JSONISH, max_size=10), PLAUSIBLE, JSONISH))
def test_reader_never_raises(data: Any) -> None:
    record = OmniErrorDetails.from_wire(data)
    assert type(record) is OmniErrorDetails
    low = 400 if record.category == "client" else 500
    assert low <= record.status_code < low + 100
    assert record.message == sanitize_message(record.message)
    assert OmniErrorDetails.from_wire(record.to_wire()) == record
    if record.category == "client":
        # Only a well-formed record can be a client error: never by accident.
        assert isinstance(data, dict)
        assert data["status_code"] == record.status_code


# -- cheap to import -----------------------------------------------------------------


def test_record_and_sanitizer_import_without_vllm_or_torch() -> None:
    code = (
        "import sys\n"
        "import vllm_omni.errors.details, vllm_omni.errors.sanitize\n"
        "import vllm_omni.errors as e\n"
        "e.OmniErrorDetails, e.sanitize_message, e.GENERIC_SERVER_MESSAGE\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('vllm', 'torch', 'transformers', 'numpy'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout == "[]\n"


# -- issue 13: defaults follow the status; message falls back to error --------


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "BadRequestError"),
        (401, "AuthenticationError"),
        (404, "NotFoundError"),
        (409, "ConflictError"),
        (413, "RequestTooLargeError"),
        (422, "UnprocessableEntityError"),
        (429, "RateLimitError"),
        (418, "BadRequestError"),
        (500, "InternalServerError"),
        (501, "NotImplementedError"),
        (503, "ServiceUnavailableError"),
        (504, "GatewayTimeoutError"),
        (599, "InternalServerError"),
    ],
)
def test_a_record_without_a_type_gets_its_status_type(
    status: int, error_type: str
) -> None:
    category = "client" if status < 500 else "server"
    for legacy in ({"error": "x", "status_code": status}, {"error_type": None}):
        record = OmniErrorDetails.from_wire(
            {"error": "x", "status_code": status} | legacy
        )
        assert (record.category, record.error_type) == (category, error_type)
    typed = {"message": "x", "category": category, "status_code": status}
    assert OmniErrorDetails.from_wire(typed).error_type == error_type


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"message": None, "error": "old", "category": "client", "status_code": 400},
            "old",
        ),
        ({"message": 7, "error": "old", "status_code": 404}, "old"),
        ({"error": "old", "status_code": 404}, "old"),
        ({"message": "new", "error": "old", "status_code": 404}, "new"),
        ({"message": "", "status_code": 404}, "Not Found"),
        ({"message": "  ", "error": "", "status_code": 409}, "Conflict"),
        ({"status_code": 503}, "Service Unavailable"),
        ({"message": None, "status_code": 500}, "Internal Server Error"),
        ({"message": "", "status_code": 499}, "Client Error"),
    ],
    ids=[
        "null-message",
        "non-text-message",
        "legacy",
        "both",
        "empty-404",
        "blank-409",
        "missing-503",
        "null-500",
        "empty-unknown-status",
    ],
)
def test_reader_falls_back_from_message_to_error_to_the_status_phrase(
    record: dict[str, Any], message: str
) -> None:
    details = OmniErrorDetails.from_wire(record)
    assert details.message == message
    assert details.status_code == record["status_code"]
