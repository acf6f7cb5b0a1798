"""The one check of "is this a canonical error response" used by the e2e tests."""

from __future__ import annotations

from typing import Any

_REQUIRED = {"message", "type", "param", "code"}
# ``error_stage_id``: 0.30's name of ``stage_id``, kept for one release.
_OPTIONAL = {"request_id", "stage_id", "error_stage_id"}


def assert_canonical_error(status: int, body: Any, headers: Any = None) -> None:
    """Fail unless ``body`` is ``{"error": {...}}`` with ``code == status``."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict), body
    assert _REQUIRED <= set(error) <= _REQUIRED | _OPTIONAL, error
    assert error["code"] == status, (status, error)
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error.get("error_stage_id") == error.get("stage_id"), error
    if headers is not None and "request_id" in error:
        header = headers.get("x-request-id")
        if isinstance(header, list):  # schemathesis keeps every value
            header = header[0] if len(header) == 1 else header
        assert header == error["request_id"], error
