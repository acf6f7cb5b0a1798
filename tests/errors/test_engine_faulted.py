"""vLLM 0.34's ``EngineFaultedError`` in the contract (docs/errors/status-mapping.md):
a server 503 ``ServiceUnavailableError`` marked ``faulted``, retryable with a
``Retry-After`` from the record, logged once at INFO without a traceback,
counted, and rebuilt as its own class for Python callers: in this process,
after a pickle, across a real process and across the stage wire.

Where the installed vLLM does not define the class (0.33), only the absence
is checked: the name is in neither ``vllm_omni.errors`` nor the table.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
import vllm.exceptions
from prometheus_client import REGISTRY

from vllm_omni import errors
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.http.reporting import details_for_exception
from vllm_omni.errors.normalizer import (
    for_caller,
    normalize,
    raise_for_caller,
    to_exception,
)
from vllm_omni.errors.render import (
    http_error_response,
    job_error,
    retry_headers,
    ws_close_code,
)
from vllm_omni.errors.table import STATUS_TABLE, row_for
from vllm_omni.errors.types import (
    ENGINE_FAULTED,
    OmniServerError,
    OmniServiceUnavailableError,
)
from vllm_omni.wire import messages

UPSTREAM = getattr(vllm.exceptions, "EngineFaultedError", None)
needs_034 = pytest.mark.skipif(
    UPSTREAM is None, reason="the installed vLLM has no EngineFaultedError (0.34+)"
)
TEXT = (
    "The engine has faulted and cannot accept new requests. "
    "Please try again later or on a different instance."
)


def test_present_exactly_where_vllm_defines_it() -> None:
    rows = [
        row for row in STATUS_TABLE if row.exc_type.__name__ == "EngineFaultedError"
    ]
    assert ENGINE_FAULTED is UPSTREAM
    if UPSTREAM is None:
        assert rows == []
        assert not hasattr(errors, "EngineFaultedError")
        with pytest.raises(AttributeError, match=r"vLLM 0\.34"):
            errors.__getattr__("EngineFaultedError")
    else:
        assert [row.exc_type for row in rows] == [UPSTREAM]
        assert errors.EngineFaultedError is UPSTREAM  # by identity


@needs_034
def test_the_record() -> None:
    assert UPSTREAM is not None
    exc = UPSTREAM()
    assert row_for(UPSTREAM).exc_type is UPSTREAM
    assert normalize(exc, request_id="r-1") == OmniErrorDetails(
        TEXT, "server", 503, "ServiceUnavailableError", request_id="r-1", faulted=True
    )


@needs_034
@pytest.mark.parametrize(
    ("retry_after_s", "header"),
    [
        (None, "1"),
        (30, "30"),
        (12.2, "13"),
        (0.01, "1"),
        (0, "1"),
        (-5, "1"),
        (math.nan, "1"),
        (math.inf, "3600"),
        (10**9, "3600"),
        (True, "1"),
        ("30", "1"),
    ],
)
def test_retry_after_comes_from_the_record(retry_after_s: object, header: str) -> None:
    assert UPSTREAM is not None
    exc = UPSTREAM()
    if retry_after_s is not None:
        exc.retry_after_s = retry_after_s  # type: ignore[attr-defined]
    record = normalize(exc)
    assert record.faulted and record.status_code == 503
    assert dict(retry_headers(record)) == {
        "x-should-retry": "true",
        "Retry-After": header,
    }
    response = http_error_response(record)
    assert response.status_code == 503
    assert response.headers["retry-after"] == header
    assert job_error(record)["retryable"] is True
    assert ws_close_code(record) == 1013  # try again later


@needs_034
def test_logged_once_at_info_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert UPSTREAM is not None
    caplog.set_level(logging.INFO, logger="vllm_omni.errors")
    for exc in (UPSTREAM(), for_caller(UPSTREAM())):
        caplog.clear()
        details_for_exception(exc, request_id="r-2")
        [entry] = caplog.records
        assert entry.levelno == logging.INFO and entry.exc_info is None
        assert entry.getMessage() == (
            "request r-2 refused with 503 ServiceUnavailableError (engine faulted)"
        )


def _refusals(stage: str) -> float:
    value = REGISTRY.get_sample_value(
        "vllm_omni:engine_faulted_refusals_total", {"stage": stage}
    )
    return value or 0.0


@needs_034
def test_counted_by_stage_on_every_transport() -> None:
    assert UPSTREAM is not None
    before = _refusals("1"), _refusals("")
    http_error_response(normalize(UPSTREAM(), stage_id=1))
    job_error(normalize(UPSTREAM(), stage_id=1))
    http_error_response(normalize(UPSTREAM()))
    assert (_refusals("1"), _refusals("")) == (before[0] + 2, before[1] + 1)


@needs_034
def test_python_callers_catch_it_by_class_and_it_pickles() -> None:
    assert UPSTREAM is not None
    original = UPSTREAM()
    with pytest.raises(UPSTREAM) as info:
        raise_for_caller(original, request_id="r-3")
    raised = info.value
    assert type(raised).__name__ == "RemoteEngineFaultedError"
    assert type(raised) is errors.RemoteEngineFaultedError
    assert isinstance(raised, OmniServiceUnavailableError | OmniServerError)
    assert raised.__cause__ is original
    assert raised.details == normalize(original, request_id="r-3")  # type: ignore[attr-defined]
    assert (raised.message, raised.http_status) == (
        original.message,
        original.http_status,
    )
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(raised, protocol=protocol))
        assert type(clone) is type(raised)
        assert clone.details == raised.details  # type: ignore[attr-defined]
        assert for_caller(clone) is clone


def _raise_in_a_child() -> None:
    # What an offline caller's worker does with the engine's refusal.
    raise_for_caller(vllm.exceptions.EngineFaultedError(), request_id="child-1")  # type: ignore[attr-defined]


@needs_034
def test_across_a_real_process() -> None:
    assert UPSTREAM is not None
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        with pytest.raises(UPSTREAM) as info:
            pool.submit(_raise_in_a_child).result(timeout=120)
    assert type(info.value) is errors.RemoteEngineFaultedError
    assert info.value.details.faulted  # type: ignore[attr-defined]
    assert info.value.details.request_id == "child-1"  # type: ignore[attr-defined]


@needs_034
@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
def test_across_the_stage_wire(compact: bool) -> None:
    """A stage's refusal, as the orchestrator reads it: its own class, with
    the stage and the stage's retry delay."""
    assert UPSTREAM is not None
    exc = UPSTREAM()
    exc.retry_after_s = 45  # type: ignore[attr-defined]
    record = normalize(exc, request_id="r-4", stage_id=2)
    wire = messages.encode(messages.ErrorMessage.from_details(record), compact=compact)
    decoded = messages.decode(wire)
    assert isinstance(decoded, messages.ErrorMessage)
    rebuilt = to_exception(decoded.to_details())
    assert type(rebuilt) is errors.RemoteEngineFaultedError
    assert isinstance(rebuilt, UPSTREAM)
    assert rebuilt.details == record  # type: ignore[attr-defined]
    assert dict(retry_headers(normalize(rebuilt)))["Retry-After"] == "45"
