"""The one check of "is this a canonical error response" used by the e2e tests."""

from __future__ import annotations

from typing import Any

_REQUIRED = {"message", "type", "param", "code"}
# ``error_stage_id``: 0.30's name of ``stage_id``, kept for one release.
_OPTIONAL = {"request_id", "stage_id", "error_stage_id"}


def _one(headers: Any, name: str) -> Any:
    value = headers.get(name)
    if isinstance(value, list):  # schemathesis keeps every value
        value = value[0] if len(value) == 1 else value
    return value


def _assert_error_object(status: int, error: Any, extra: set[str]) -> None:
    assert isinstance(error, dict), error
    allowed = _REQUIRED | _OPTIONAL | extra
    assert _REQUIRED | extra <= set(error) <= allowed, error
    assert error["code"] == status, (status, error)
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error.get("error_stage_id") == error.get("stage_id"), error


def assert_canonical_error(status: int, body: Any, headers: Any = None) -> None:
    """Fail unless ``body`` is ``{"error": {...}}`` with ``code == status``;
    with ``headers``, also unless they carry its request id and the retry
    guidance (``x-should-retry``, and ``Retry-After`` exactly when ``true``)."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    _assert_error_object(status, error, set())
    if headers is None:
        return
    if "request_id" in error:
        assert _one(headers, "x-request-id") == error["request_id"], error
    retry = _one(headers, "x-should-retry")
    assert retry in ("true", "false"), (status, retry)
    retry_after = _one(headers, "retry-after")
    assert retry_after == ("1" if retry == "true" else None), (status, retry_after)


def assert_canonical_event_error(status: int, error: Any) -> None:
    """Fail unless ``error`` (an SSE or WebSocket event's, or a stored job's)
    is the canonical error object plus its retry guidance as ``retryable``."""
    _assert_error_object(status, error, {"retryable"})
    assert isinstance(error["retryable"], bool), error
