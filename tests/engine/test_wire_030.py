"""Every error shape vllm-omni 0.30.0 writes is read here with its meaning,
and what this tree sends a strict 0.30 receiver decodes there (issue 22).

0.30's own ``ErrorMessage`` Struct (``forbid_unknown_fields=True``) and its
diffusion process's ``{"type": "error", ...}`` dicts are taken from the
published wheel's source at test time and executed (``tests.wheel030``);
nothing of 0.30 is copied here. The rules: ``fatal`` is never lost (a fatal
record without a status is a fatal server 500 of its stage, its text the
reason of the death); a record without a status is a server 500; a client
status without a type gets the status's public type; ``legacy_wire``
records decode in 0.30's strict Struct with nothing lost that 0.30 can hold.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import msgspec
import pytest

from tests.wheel030 import (
    dict_expressions,
    errors_030,
    evaluate,
    free_names,
    messages_030,
)
from vllm_omni.errors import OmniClientError, client_error_metadata
from vllm_omni.errors.details import (
    GENERIC_SERVER_MESSAGE,
    OmniErrorDetails,
    default_type,
)
from vllm_omni.wire import messages as m

GENERIC = GENERIC_SERVER_MESSAGE
SAFE_500 = OmniErrorDetails(GENERIC, "server", 500, "InternalServerError")


@pytest.fixture(scope="module")
def old() -> ModuleType:
    """0.30's ``vllm_omni.engine.messages`` (its error Struct and base)."""
    return messages_030()


# name: (0.30 ErrorMessage fields, the record read here, its reason)
SHAPES_030: dict[str, tuple[dict[str, Any], OmniErrorDetails, str | None]] = {
    "client": (
        {
            "error": "no such voice",
            "status_code": 404,
            "error_type": "NotFoundError",
            "request_id": "r-1",
            "stage_id": 2,
        },
        OmniErrorDetails(
            "no such voice",
            "client",
            404,
            "NotFoundError",
            request_id="r-1",
            stage_id=2,
        ),
        None,
    ),
    "client-without-type": (
        {"error": "busy", "status_code": 409, "request_id": "r-2", "stage_id": 1},
        OmniErrorDetails(
            "busy", "client", 409, "ConflictError", request_id="r-2", stage_id=1
        ),
        None,
    ),
    "server-with-status": (
        {
            "error": "kv handoff failed",
            "status_code": 502,
            "error_type": "NativeKVHandoffError",
            "request_id": "r-3",
            "stage_id": 1,
        },
        OmniErrorDetails(
            "kv handoff failed",
            "server",
            502,
            "NativeKVHandoffError",
            request_id="r-3",
            stage_id=1,
        ),
        None,
    ),
    "without-status": (
        {"error": "CFG companion lost", "request_id": "r-4", "stage_id": 0},
        dataclasses.replace(SAFE_500, request_id="r-4", stage_id=0),
        None,
    ),
    "type-without-status": (
        {"error": "odd", "error_type": "BadRequestError", "request_id": "r-5"},
        dataclasses.replace(SAFE_500, request_id="r-5"),
        None,
    ),
    "fatal": (
        {
            "error": "Stage-1 has no live replica",
            "fatal": True,
            "request_id": "r-6",
            "stage_id": 1,
        },
        dataclasses.replace(SAFE_500, request_id="r-6", stage_id=1, fatal=True),
        "Stage-1 has no live replica",
    ),
    "fatal-without-ids": (
        {"error": "Stage engine died at /opt/omni/core.py", "fatal": True},
        dataclasses.replace(SAFE_500, fatal=True),
        "Stage engine died at <path>",
    ),
    "interaction": (
        {
            "error": "No active request for interaction: r-7",
            "fatal": False,
            "request_id": "r-7",
            "event_id": "ev-1",
            "stage_id": 0,
        },
        dataclasses.replace(SAFE_500, request_id="r-7", stage_id=0),
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(SHAPES_030))
def test_every_030_error_message_is_read_with_its_meaning(
    old: ModuleType, name: str
) -> None:
    fields, expected, reason = SHAPES_030[name]
    data = msgspec.msgpack.encode(old.ErrorMessage(**fields))
    decoded = m.decode(data)
    assert isinstance(decoded, m.ErrorMessage)
    assert decoded.to_details() == expected
    assert decoded.reason == reason
    assert decoded.event_id == fields.get("event_id")


def test_the_issue_case_a_030_engine_death_stays_fatal(old: ModuleType) -> None:
    """What was seen: ``ErrorMessage(error=..., fatal=True)`` from a 0.30
    stage was read as a nonfatal 500, and the orchestrator would have kept
    sending requests to a dead stage."""
    data = msgspec.msgpack.encode(old.ErrorMessage(error="engine died", fatal=True))
    decoded = m.decode(data)
    assert isinstance(decoded, m.ErrorMessage)
    details = decoded.to_details()
    assert details.fatal and details.category == "server"
    assert details.status_code == 500


# -- this tree → a strict 0.30 receiver ------------------------------------------

RECORDS: dict[str, tuple[OmniErrorDetails, str | None, str | None]] = {
    "client-with-parameter": (
        OmniErrorDetails(
            "max_tokens is too large",
            "client",
            400,
            "BadRequestError",
            parameter="max_tokens",
            request_id="q-1",
            stage_id=1,
        ),
        None,
        None,
    ),
    "server-503": (
        OmniErrorDetails(
            "talker pool drained",
            "server",
            503,
            "ServiceUnavailableError",
            request_id="q-2",
            stage_id=2,
        ),
        None,
        None,
    ),
    "fatal-with-reason": (
        dataclasses.replace(SAFE_500, request_id="q-3", stage_id=0, fatal=True),
        "OmniEngineDeadError: gpu fell off",
        None,
    ),
    "fatal-without-reason": (
        dataclasses.replace(SAFE_500, stage_id=0, fatal=True),
        None,
        None,
    ),
    "with-event-id": (
        dataclasses.replace(SAFE_500, request_id="q-4", stage_id=0),
        None,
        "ev-9",
    ),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_legacy_wire_record_decodes_in_030s_strict_struct(
    old: ModuleType, name: str
) -> None:
    record, reason, event_id = RECORDS[name]
    message = m.ErrorMessage.from_details(record, reason=reason, event_id=event_id)
    # The default (full) record is for tolerant receivers only.
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.msgpack.decode(m.encode(message), type=old.ErrorMessage)
    data = m.encode(message, legacy_wire=True)
    received = msgspec.msgpack.decode(data, type=old.ErrorMessage)
    # 0.30's fatal text is the log text of the death.
    text = reason if record.fatal and reason else record.message
    assert (received.error, received.status_code, received.error_type) == (
        text,
        record.status_code,
        record.error_type,
    )
    assert (received.fatal, received.request_id, received.stage_id) == (
        record.fatal,
        record.request_id,
        record.stage_id,
    )
    assert received.event_id == event_id
    # Byte for byte what 0.30 itself encodes for the same values.
    assert msgspec.msgpack.encode(received) == data
    # And back: nothing lost that 0.30 can hold.
    back = m.decode(msgspec.msgpack.encode(received))
    assert isinstance(back, m.ErrorMessage)
    assert back.to_details() == dataclasses.replace(record, parameter=None)
    # A fatal record's text comes back as the reason of the death.
    assert (back.reason, back.event_id) == (text if record.fatal else None, event_id)


@pytest.mark.parametrize("name", sorted(SHAPES_030))
def test_a_030_record_round_trips_through_this_tree(old: ModuleType, name: str) -> None:
    """0.30 → here → 0.30 (``legacy_wire``): 0.30's own receiving helper
    (``raise_client_error_or`` of its ``errors.py``) decides the same owner
    and status, and fatality, ids and ``event_id`` are kept; a fatal
    record keeps its text too."""
    fields, _, _ = SHAPES_030[name]
    sent = old.ErrorMessage(**fields)
    here = m.decode(msgspec.msgpack.encode(sent))
    assert isinstance(here, m.ErrorMessage)
    back = msgspec.msgpack.decode(
        m.encode(here, legacy_wire=True), type=old.ErrorMessage
    )
    assert (back.fatal, back.request_id, back.stage_id, back.event_id) == (
        sent.fatal,
        sent.request_id,
        sent.stage_id,
        sent.event_id,
    )
    if sent.fatal:
        assert back.error == here.reason
        return
    assert _030_reading(back)[:2] == _030_reading(sent)[:2]
    if sent.status_code is not None:
        assert back.error == sent.error
        # A type 0.30 left out is the status's type now (0.30 said
        # BadRequestError whatever the status).
        assert back.error_type == (sent.error_type or default_type(sent.status_code))


def _030_reading(message: Any) -> tuple[Any, ...]:
    """What 0.30's receiver raises for a nonfatal record."""
    old_errors = errors_030()
    try:
        old_errors.raise_client_error_or(
            message.error,
            status_code=message.status_code,
            error_type=message.error_type,
            fallback=RuntimeError,
        )
    except old_errors.OmniClientError as exc:
        return ("client", exc.status_code, exc.error_type)
    except RuntimeError:
        return ("server",)
    raise AssertionError("raise_client_error_or returned")


# -- the diffusion process's error dict ---------------------------------------------

DIFFUSION_PROC = "diffusion/stage_diffusion_proc.py"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            OmniClientError("width must be a multiple of 16", status_code=400),
            OmniErrorDetails(
                "width must be a multiple of 16",
                "client",
                400,
                "BadRequestError",
                request_id="d-1",
            ),
        ),
        (
            OmniClientError(
                "no such LoRA", status_code=404, error_type="NotFoundError"
            ),
            OmniErrorDetails(
                "no such LoRA", "client", 404, "NotFoundError", request_id="d-1"
            ),
        ),
        (
            RuntimeError("CUDA out of memory at /opt/x.py"),
            dataclasses.replace(SAFE_500, request_id="d-1"),
        ),
    ],
    ids=["400", "404", "server"],
)
def test_the_030_diffusion_process_error_dicts_are_read(
    exc: Exception, expected: OmniErrorDetails
) -> None:
    """The dicts are evaluated from the wheel's source, with the status and
    type 0.30 computes beside them (``client_error_metadata``, here this
    package's, as after the drop-in)."""
    dicts = dict_expressions(DIFFUSION_PROC, type="error")
    assert len(dicts) == 2  # a request's failure, a collective RPC's
    status_code, error_type = _quiet(client_error_metadata, exc)
    namespace = {
        "request_id": "d-1",
        "rpc_id": "rpc-1",
        "e": exc,
        "str": str,
        "status_code": status_code,
        "error_type": error_type,
        # 0.30's per-request timing metrics ride along; not error fields.
        "diffusion_exception_metrics": lambda _: {"peak_memory_mb": 1.5},
    }
    for node in dicts:
        assert free_names(node) <= set(namespace), free_names(node) - set(namespace)
        sent = evaluate(DIFFUSION_PROC, node, namespace)
        decoded = m.decode(msgspec.msgpack.encode(sent))
        assert isinstance(decoded, m.ErrorMessage), sent
        details = decoded.to_details()
        if "request_id" in sent:
            assert details == expected
        else:  # a collective RPC failed: no request, no status
            assert details == SAFE_500


def _quiet(function: Any, *args: Any) -> Any:
    with pytest.warns(DeprecationWarning):
        return function(*args)
