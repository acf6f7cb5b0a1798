"""Stage wire messages: tagged, tolerant, and readable across versions (§6)."""

from __future__ import annotations

import msgspec
import pytest

from vllm_omni.errors.details import LEGACY_WIRE_FIELDS, WIRE_FIELDS, OmniErrorDetails
from vllm_omni.wire import messages as m

CLIENT = OmniErrorDetails(
    "max_tokens must be an integer between 1 and 4096",
    "client",
    400,
    "BadRequestError",
    parameter="max_tokens",
    request_id="req-1",
    stage_id=1,
)
SERVER = OmniErrorDetails(
    "The server had an error while processing your request.",
    "server",
    500,
    "InternalServerError",
    request_id="req-2",
    stage_id=2,
)
FATAL = OmniErrorDetails(
    "The server had an error while processing your request.",
    "server",
    500,
    "InternalServerError",
    request_id="req-3",
    stage_id=0,
    fatal=True,
)


class LegacyError(msgspec.Struct, tag="error", tag_field="type"):
    """A 0.30-era receiver: only the legacy flat fields (tolerant by default).
    The real 0.30 Struct, from the wheel, is in ``test_wire_030.py``."""

    error: str
    status_code: int
    error_type: str
    fatal: bool = False
    request_id: str | None = None
    stage_id: int | None = None
    event_id: str | None = None


class StrictLegacyError(LegacyError, forbid_unknown_fields=True):
    """A 0.30-era receiver that rejects fields it does not know."""


@pytest.mark.parametrize(
    "details", [CLIENT, SERVER, FATAL], ids=["4xx", "5xx", "fatal"]
)
def test_error_message_round_trip_keeps_every_field(details: OmniErrorDetails) -> None:
    decoded = m.decode(m.encode(m.ErrorMessage.from_details(details)))
    assert isinstance(decoded, m.ErrorMessage)
    assert decoded.to_details() == details


def test_error_message_carries_full_and_legacy_fields_flat() -> None:
    raw = msgspec.msgpack.decode(m.encode(m.ErrorMessage.from_details(CLIENT)))
    assert raw["type"] == "error"
    # Fields at their default (fatal=False, faulted=False, no retry delay)
    # are not sent: a 0.30 receiver has the same defaults.
    assert set(raw) == {"type", *WIRE_FIELDS, *LEGACY_WIRE_FIELDS} - {
        "fatal",
        "faulted",
        "retry_after_s",
    }
    assert raw["error"] == raw["message"] == CLIENT.message
    assert raw["category"] == "client" and raw["parameter"] == "max_tokens"


@pytest.mark.parametrize(
    "details", [CLIENT, SERVER, FATAL], ids=["4xx", "5xx", "fatal"]
)
def test_legacy_decoder_reads_a_new_error_message(details: OmniErrorDetails) -> None:
    data = m.encode(m.ErrorMessage.from_details(details))
    old = msgspec.msgpack.decode(data, type=LegacyError)
    assert (old.error, old.status_code, old.error_type) == (
        details.message,
        details.status_code,
        details.error_type,
    )
    assert (old.fatal, old.request_id, old.stage_id) == (
        details.fatal,
        details.request_id,
        details.stage_id,
    )


def test_legacy_wire_serves_a_strict_legacy_receiver() -> None:
    message = m.ErrorMessage.from_details(CLIENT)
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(m.encode(message), type=StrictLegacyError)
    legacy = m.encode(message, legacy_wire=True)
    assert set(msgspec.msgpack.decode(legacy)) == {
        "type",
        *LEGACY_WIRE_FIELDS,
        "event_id",
    }
    old = msgspec.msgpack.decode(legacy, type=StrictLegacyError)
    assert old.error == CLIENT.message and old.status_code == 400


@pytest.mark.parametrize(
    ("status", "error_type", "category"),
    [
        (400, "BadRequestError", "client"),
        (404, "NotFoundError", "client"),
        (422, "UnprocessableEntityError", "client"),
        (500, "InternalServerError", "server"),
        (503, "ServiceUnavailableError", "server"),
    ],
)
def test_new_decoder_reads_a_legacy_error_message(
    status: int, error_type: str, category: str
) -> None:
    legacy = LegacyError(
        error="legacy text",
        status_code=status,
        error_type=error_type,
        request_id="old-1",
        stage_id=4,
    )
    decoded = m.decode(msgspec.msgpack.encode(legacy))
    assert isinstance(decoded, m.ErrorMessage)
    details = decoded.to_details()
    assert details.category == category  # read by status: the sender did not say
    assert (details.message, details.status_code, details.error_type) == (
        "legacy text",
        status,
        error_type,
    )
    assert (details.request_id, details.stage_id, details.parameter) == (
        "old-1",
        4,
        None,
    )


def test_unknown_fields_are_ignored_and_unknown_types_dropped() -> None:
    newer = msgspec.msgpack.encode(
        {
            "type": "output",
            "request_id": "r",
            "stage_id": 1,
            "finished": True,
            "payload": {"text": "hi", "future": 1},
            "trace": {"span": "x"},
        }
    )
    decoded = m.decode(newer)
    assert isinstance(decoded, m.Output)
    assert decoded.finished and decoded.payload.text == "hi"
    assert m.decode(msgspec.msgpack.encode({"type": "telemetry", "x": 1})) is None
    assert m.decode(b"\xc1 not msgpack") is None


def test_malformed_error_becomes_a_safe_server_record() -> None:
    data = msgspec.msgpack.encode(
        {
            "type": "error",
            "status_code": "four hundred",
            "request_id": "r-9",
            "stage_id": 2,
        }
    )
    decoded = m.decode(data)
    assert isinstance(decoded, m.ErrorMessage)
    details = decoded.to_details()
    assert (details.category, details.status_code) == ("server", 500)
    assert (details.request_id, details.stage_id) == ("r-9", 2)


def test_media_travels_as_bytes_in_outputs() -> None:
    payload = m.Payload(audio=b"RIFF\x00\x01", images=[b"\x89PNG"], video=b"GIF89a")
    raw = m.encode(m.Output(request_id="r", stage_id=3, payload=payload))
    decoded = m.decode(raw)
    assert isinstance(decoded, m.Output) and decoded.payload == payload
    assert "audio" not in m.ErrorMessage.__struct_fields__


# -- issue 13: compact records between 0.31 peers, fatal reasons ---------------


@pytest.mark.parametrize(
    "details", [CLIENT, SERVER, FATAL], ids=["4xx", "5xx", "fatal"]
)
def test_compact_record_carries_each_text_once(details: OmniErrorDetails) -> None:
    message = m.ErrorMessage.from_details(details)
    compact = m.encode(message, compact=True)
    raw = msgspec.msgpack.decode(compact)
    assert raw["type"] == "e" and "error" not in raw
    assert (raw["m"], raw["c"], raw["s"], raw["t"]) == (
        details.message,
        details.category,
        details.status_code,
        details.error_type,
    )
    assert list(raw.values()).count(details.message) == 1
    decoded = m.decode(compact)
    assert isinstance(decoded, m.ErrorMessage)
    assert decoded.to_details() == details
    assert len(compact) < len(m.encode(message))


def test_legacy_wire_wins_over_compact() -> None:
    message = m.ErrorMessage.from_details(CLIENT)
    legacy = m.encode(message, legacy_wire=True, compact=True)
    assert msgspec.msgpack.decode(legacy, type=StrictLegacyError).error == (
        CLIENT.message
    )


def test_compact_record_is_at_most_1_3x_the_legacy_record() -> None:
    for details in (CLIENT, SERVER, FATAL):
        message = m.ErrorMessage.from_details(details)
        compact = len(m.encode(message, compact=True))
        legacy = len(m.encode(message, legacy_wire=True))
        assert compact <= 1.3 * legacy, (details.error_type, compact, legacy)


def test_a_fatal_reason_travels_beside_the_record_but_not_in_it() -> None:
    message = m.ErrorMessage.from_details(FATAL, reason="gpu fell off")
    for compact in (False, True):
        decoded = m.decode(m.encode(message, compact=compact))
        assert isinstance(decoded, m.ErrorMessage)
        assert decoded.reason == "gpu fell off"
        assert decoded.to_details() == FATAL
    legacy = msgspec.msgpack.decode(m.encode(message, legacy_wire=True))
    assert "reason" not in legacy


def test_ready_announces_the_wire_and_welcome_answers() -> None:
    ready = m.decode(
        m.encode(m.Ready(stage_id=1, pid=2, kind="text", wire=m.WIRE_VERSION))
    )
    assert isinstance(ready, m.Ready) and ready.wire == m.WIRE_VERSION
    # A 0.30 stage's Ready has no wire: it speaks the 0.30 record.
    old = msgspec.msgpack.encode(
        {"type": "ready", "stage_id": 1, "pid": 2, "kind": "t"}
    )
    old_ready = m.decode(old)
    assert isinstance(old_ready, m.Ready) and old_ready.wire == 1
    welcome = m.decode(m.encode(m.Welcome(wire=m.WIRE_VERSION)))
    assert welcome == m.Welcome(wire=m.WIRE_VERSION)


def test_a_malformed_compact_record_keeps_what_it_can() -> None:
    data = msgspec.msgpack.encode(
        {"type": "e", "m": "x", "s": "404", "r": "r1", "i": 2}
    )
    decoded = m.decode(data)
    assert isinstance(decoded, m.ErrorMessage)
    assert decoded.to_details() == OmniErrorDetails(
        "The server had an error while processing your request.",
        "server",
        500,
        "InternalServerError",
        request_id="r1",
        stage_id=2,
    )


# -- issue 22: 0.30's shapes without a status ------------------------------------


def test_a_030_engine_death_without_a_status_stays_fatal() -> None:
    """0.30's Struct sends every field: a death has null ``status_code`` and
    ``error_type`` (``test_wire_030.py`` uses 0.30's own Struct)."""
    data = msgspec.msgpack.encode(
        {
            "type": "error",
            "error": "Stage engine died at /opt/omni/x.py",
            "status_code": None,
            "error_type": None,
            "fatal": True,
            "request_id": None,
            "stage_id": 1,
            "event_id": None,
        }
    )
    decoded = m.decode(data)
    assert isinstance(decoded, m.ErrorMessage)
    assert decoded.to_details() == OmniErrorDetails(
        "The server had an error while processing your request.",
        "server",
        500,
        "InternalServerError",
        stage_id=1,
        fatal=True,
    )
    assert decoded.reason == "Stage engine died at <path>"


def test_event_id_travels_in_every_shape() -> None:
    message = m.ErrorMessage.from_details(SERVER, event_id="ev-3")
    for shape in ({}, {"compact": True}, {"legacy_wire": True}):
        decoded = m.decode(m.encode(message, **shape))
        assert isinstance(decoded, m.ErrorMessage)
        assert decoded.event_id == "ev-3", shape
        assert decoded.to_details() == SERVER, shape


FAULTED = OmniErrorDetails(
    "The engine has faulted and cannot accept new requests.",
    "server",
    503,
    "ServiceUnavailableError",
    request_id="r-9",
    stage_id=1,
    faulted=True,
    retry_after_s=30,
)


@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
def test_a_faulted_record_keeps_its_mark_and_retry_delay(compact: bool) -> None:
    decoded = m.decode(m.encode(m.ErrorMessage.from_details(FAULTED), compact=compact))
    assert isinstance(decoded, m.ErrorMessage)
    assert decoded.to_details() == FAULTED


def test_a_0_30_receiver_gets_a_faulted_record_as_a_plain_503() -> None:
    raw = msgspec.msgpack.decode(
        m.encode(m.ErrorMessage.from_details(FAULTED), legacy_wire=True)
    )
    assert set(raw) == {"type", "event_id", *LEGACY_WIRE_FIELDS}
    assert (raw["status_code"], raw["error_type"]) == (503, "ServiceUnavailableError")


def test_a_heartbeat_carries_an_engine_status_an_old_peer_ignores() -> None:
    status = {"id": 0, "status": "unhealthy", "fault_info": "RuntimeError"}
    beat = m.Heartbeat(stage_id=1, engine_status=status, recovery_window_s=120.0)
    decoded = m.decode(m.encode(beat))
    assert isinstance(decoded, m.Heartbeat)
    assert (decoded.engine_status, decoded.recovery_window_s) == (status, 120.0)
    # A stage without fault tolerance sends what it always sent.
    plain = msgspec.msgpack.decode(m.encode(m.Heartbeat(stage_id=1)))
    assert plain == {"type": "heartbeat", "stage_id": 1}

    class OldHeartbeat(msgspec.Struct, tag_field="type", tag="heartbeat"):
        stage_id: int | None = None

    old = msgspec.msgpack.decode(m.encode(beat), type=OldHeartbeat)
    assert old.stage_id == 1


def test_a_utility_call_carries_its_arguments() -> None:
    call = m.UtilityRequest(
        call_id=3,
        method="handle_fault",
        args={"instruction": "retry", "params": {}, "request_id": "r"},
    )
    assert m.decode(m.encode(call)) == call
    assert msgspec.msgpack.decode(
        m.encode(m.UtilityRequest(call_id=4, method="stats"))
    ) == {
        "type": "utility",
        "call_id": 4,
        "method": "stats",
    }


class _Submit030(msgspec.Struct, tag_field="type", tag="submit", kw_only=True):
    """0.30's submission: no ``trace``."""

    request_id: str
    prompt: str
    params: dict[str, object] = {}


def test_a_submission_carries_the_trace_context_and_old_peers_work() -> None:
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    sent = m.encode(m.Submit(request_id="r", prompt="p", trace=headers))
    received = m.decode(sent)
    assert isinstance(received, m.Submit) and received.trace == headers
    # A 0.30 stage reads the submission without it; a 0.30 orchestrator's
    # submission has none (its stage span starts a trace of its own).
    old = msgspec.msgpack.decode(sent, type=_Submit030)
    assert (old.request_id, old.prompt) == ("r", "p")
    legacy = m.decode(msgspec.msgpack.encode(_Submit030(request_id="r", prompt="p")))
    assert isinstance(legacy, m.Submit) and legacy.trace is None
