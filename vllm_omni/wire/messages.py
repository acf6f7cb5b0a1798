"""Stage wire messages: msgspec Structs tagged by a literal ``type`` field.

Maps every message, and ``OmniErrorDetails.to_wire``/``from_wire`` dicts, onto
Structs read tolerantly (docs/design.md §6, docs/errors/stages.md). It must
not import vLLM or torch, and must not look at exceptions.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import msgspec

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.sanitize import sanitize_message

# 1: the 0.30 error record (``error`` only); 2: 0.31 (``message`` and the
# complete field set; compact records once both peers say so).
WIRE_VERSION = 2

__all__ = [
    "WIRE_VERSION",
    "Abort",
    "CompactError",
    "ErrorMessage",
    "Heartbeat",
    "LegacyErrorMessage",
    "Message",
    "Output",
    "Payload",
    "Ready",
    "Shutdown",
    "Submit",
    "UtilityRequest",
    "UtilityResponse",
    "Welcome",
    "decode",
    "encode",
]


class Payload(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a stage produced (an output chunk) or consumes (its upstream result).

    ``text`` is a delta in a streamed chunk and the full text as an input.
    """

    text: str = ""
    tokens: list[int] = []
    audio: bytes | None = None
    images: list[bytes] = []
    video: bytes | None = None
    meta: dict[str, Any] = {}
    # Text stages with several choices (``n``): the choice this chunk belongs
    # to, the reason that choice finished (on its last chunk), and the chunk's
    # logprobs already in the OpenAI shape of the request's API.
    index: int = 0
    finish_reason: str | None = None
    logprobs: Any = None


class _Base(msgspec.Struct, tag_field="type", kw_only=True):
    """Common base: every message is tagged by ``type``."""


class Ready(_Base, tag="ready"):
    """Stage → orchestrator, once: the stage is built and accepts work."""

    stage_id: int
    pid: int
    kind: str
    version: str = ""
    # The error-record wire this stage speaks; a 0.30 stage does not say (1).
    wire: int = 1


class Welcome(_Base, tag="welcome"):
    """Orchestrator → stage, answering ``Ready``: the wire both peers speak.

    A 0.30 stage ignores it (unknown type); a 0.30 orchestrator never sends
    it, so its stages keep sending the full record.
    """

    wire: int


class Heartbeat(_Base, tag="heartbeat", omit_defaults=True):
    """Either direction, periodically: liveness for stages on other hosts.

    A stage whose engine runs fault tolerance adds its status (vLLM 0.34's
    ``engine_status`` entry, ``engine.fault_tolerance``) and recovery window,
    and beats at once when the status changes; a stage without it, or an
    older stage, sends neither (a peer that does not know them ignores them).
    """

    stage_id: int | None = None
    engine_status: dict[str, Any] | None = None
    recovery_window_s: float | None = None


class Submit(_Base, tag="submit"):
    """Orchestrator → stage: run one request through this stage.

    ``trace``: the W3C trace headers (``traceparent``, ``tracestate``) the
    stage's span continues (``vllm_omni.tracing``); a 0.30 peer neither
    sends nor reads it, and a stage without it starts a trace of its own.
    """

    request_id: str
    prompt: str
    params: dict[str, Any] = {}
    inputs: Payload | None = None
    trace: dict[str, str] | None = None


class Output(_Base, tag="output"):
    """Stage → orchestrator: one chunk of a result; the last is ``finished``."""

    request_id: str
    stage_id: int
    payload: Payload = msgspec.field(default_factory=Payload)
    finished: bool = False


class Abort(_Base, tag="abort"):
    """Orchestrator → stage: stop working on a request (cancel, deadline, failure)."""

    request_id: str


class ErrorMessage(_Base, tag="error", omit_defaults=True):
    """Stage → orchestrator: a request (or the stage, when ``fatal``) failed.

    The §3 field set flat, plus ``error`` (the 0.30 name of ``message``; empty
    in a compact record), ``reason`` (the log text of a fatal error) and
    ``event_id`` (0.30: the client event an interaction error answers).
    ``message``/``category``/``parameter`` are ``None`` when a legacy sender
    omitted them, ``status_code``/``error_type`` when a 0.30 sender did;
    ``to_details`` then reads the record as 0.30 meant it. Fields at their
    default are not sent: a 0.30 receiver has the same defaults.
    """

    status_code: int | None = None
    error_type: str | None = None
    error: str = ""
    fatal: bool = False
    request_id: str | None = None
    stage_id: int | None = None
    message: str | None = None
    category: str | None = None
    parameter: str | None = None
    faulted: bool = False
    retry_after_s: int | None = None
    reason: str | None = None
    event_id: str | None = None

    @classmethod
    def from_details(
        cls,
        details: OmniErrorDetails,
        *,
        reason: str | None = None,
        event_id: str | None = None,
    ) -> ErrorMessage:
        return cls(**details.to_wire(), reason=reason, event_id=event_id)

    def to_details(self) -> OmniErrorDetails:
        fields = msgspec.structs.asdict(self)
        fields.pop("reason")
        fields.pop("event_id")
        return OmniErrorDetails.from_wire(
            {key: value for key, value in fields.items() if value is not None}
        )


# The record's fields on the compact wire: one or two letters each, plus the
# message's own ``reason`` and ``event_id``.
_COMPACT_NAMES = {
    "message": "m",
    "category": "c",
    "status_code": "s",
    "error_type": "t",
    "parameter": "p",
    "request_id": "r",
    "stage_id": "i",
    "fatal": "f",
    "faulted": "ft",
    "retry_after_s": "ra",
    "reason": "why",
    "event_id": "ev",
}


def _record_fields() -> list[tuple[Any, ...]]:
    """``OmniErrorDetails``'s fields as msgspec declares them (its one list);
    ``category`` read as any string, which ``from_wire`` then checks."""
    hints = typing.get_type_hints(OmniErrorDetails)
    hints["category"] = str
    return [
        (field.name, hints[field.name])
        if field.default is dataclasses.MISSING
        else (field.name, hints[field.name], field.default)
        for field in dataclasses.fields(OmniErrorDetails)
    ]


RECORD_FIELDS = tuple(field.name for field in dataclasses.fields(OmniErrorDetails))

CompactError = msgspec.defstruct(
    "CompactError",
    [*_record_fields(), ("reason", str | None, None), ("event_id", str | None, None)],
    bases=(_Base,),
    module=__name__,
    tag="e",
    omit_defaults=True,
    rename=_COMPACT_NAMES,
)
CompactError.__doc__ = """The error record between 0.31 peers, in fewer bytes.

An ``ErrorMessage`` with one- or two-letter keys; sent only after
``Welcome`` (a 0.30 orchestrator would drop the unknown tag); ``decode``
returns it as an ``ErrorMessage``.
"""


class LegacyErrorMessage(_Base, tag="error"):
    """The 0.30 error message (``legacy_wire``): its fields, in its order,
    every one sent, as 0.30's Struct encodes them."""

    error: str
    status_code: int
    error_type: str
    fatal: bool = False
    request_id: str | None = None
    stage_id: int | None = None
    event_id: str | None = None


class UtilityRequest(_Base, tag="utility", omit_defaults=True):
    """Orchestrator → stage: call a named utility (``stats``; ``handle_fault``
    with its instruction in ``args``)."""

    call_id: int
    method: str
    args: dict[str, Any] = {}


class UtilityResponse(_Base, tag="utility_result"):
    """Stage → orchestrator: the result of a ``UtilityRequest``."""

    call_id: int
    stage_id: int
    result: Any = None


class Shutdown(_Base, tag="shutdown"):
    """Orchestrator → stage: finish up and exit."""


Message = (
    Ready
    | Welcome
    | Heartbeat
    | Submit
    | Output
    | Abort
    | ErrorMessage
    | CompactError
    | UtilityRequest
    | UtilityResponse
    | Shutdown
)

_COMPACT_KEYS = {
    field.name: field.encode_name
    for field in msgspec.structs.fields(CompactError)  # type: ignore[arg-type]
}
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_raw_decoder = msgspec.msgpack.Decoder()


def encode(
    message: Message, *, legacy_wire: bool = False, compact: bool = False
) -> bytes:
    """Serialize ``message``; an error in the shape asked for: full, compact or
    legacy (docs/errors/stages.md, "Three shapes").

    ``legacy_wire`` wins over ``compact``: a stage configured for a strict
    0.30 receiver never sends anything else.
    """
    if isinstance(message, ErrorMessage) and (legacy_wire or compact):
        if compact and not legacy_wire and _complete(message):
            # Built from a record (``from_details``): its fields are that
            # record's, read and checked once already.
            return _encoder.encode(_compact(message, message))
        details = message.to_details()
        if legacy_wire:
            legacy = details.to_wire(legacy=True)
            if details.fatal and message.reason:
                # 0.30 says why the engine died in ``error`` (its receivers
                # log it; clients get upstream's fixed text either way).
                legacy["error"] = message.reason
            return _encoder.encode(
                LegacyErrorMessage(**legacy, event_id=message.event_id)
            )
        return _encoder.encode(_compact(details, message))
    return _encoder.encode(message)


def _compact(record: OmniErrorDetails | ErrorMessage, message: ErrorMessage) -> Any:
    """A ``CompactError`` of ``record``'s fields and ``message``'s own."""
    return CompactError(
        **{name: getattr(record, name) for name in RECORD_FIELDS},
        reason=message.reason,
        event_id=message.event_id,
    )


def _complete(message: ErrorMessage) -> bool:
    """Whether ``message`` holds the complete 0.31 field set (every error
    record a 0.31 sender builds does), as opposed to fields a 0.30 sender
    left out, which only ``to_details`` may fill in."""
    return (
        message.message is not None
        and message.category is not None
        and message.status_code is not None
        and message.error_type is not None
    )


def decode(data: bytes) -> Message | None:
    """Deserialize tolerantly: unknown fields ignored, unknown types → ``None``.

    An ``error`` whose fields do not match the schema is not dropped: it is
    read through ``OmniErrorDetails.from_wire``, which keeps what it can and
    falls back to a safe server-500 record.
    """
    try:
        message = _decoder.decode(data)
    except msgspec.DecodeError:
        pass
    else:
        if isinstance(message, CompactError):
            return ErrorMessage(**msgspec.structs.asdict(message))
        if isinstance(message, ErrorMessage):
            return _with_reason(message)
        return message
    try:
        raw = _raw_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    if isinstance(raw, dict) and raw.get("type") in ("error", "e"):
        if raw["type"] == "e":
            raw = {name: raw[key] for name, key in _COMPACT_KEYS.items() if key in raw}
        return ErrorMessage.from_details(OmniErrorDetails.from_wire(raw))
    return None


def _with_reason(message: ErrorMessage) -> ErrorMessage:
    """A 0.30 fatal record (no ``message``, no ``reason``) says why the
    engine died in ``error``: that text, sanitized, is its ``reason``."""
    if message.fatal and message.message is None and message.reason is None:
        message.reason = sanitize_message(message.error).strip() or None
    return message
