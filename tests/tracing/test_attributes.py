"""A record as span attributes (``vllm_omni.tracing.attributes``): the
record's fields and nothing else, and ``ERROR`` for server-owned failures
only."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.tracing.attributes import is_error, record_attributes

CASES = [
    pytest.param(
        OmniErrorDetails(
            message="temperature must be between 0 and 2",
            category="client",
            status_code=400,
            error_type="BadRequestError",
            parameter="temperature",
            request_id="r1",
            stage_id=1,
        ),
        {
            "error.type": "BadRequestError",
            "vllm_omni.status_code": 400,
            "vllm_omni.category": "client",
            "vllm_omni.fatal": False,
            "vllm_omni.retryable": False,
            "vllm_omni.error.message": "temperature must be between 0 and 2",
            "vllm_omni.error.param": "temperature",
            "vllm_omni.stage_id": 1,
            "vllm_omni.request_id": "r1",
        },
        False,
        id="client-400-with-param",
    ),
    pytest.param(
        OmniErrorDetails(
            message="Stage 1 (thinker) did not finish within 3 s.",
            category="server",
            status_code=504,
            error_type="GatewayTimeoutError",
            stage_id=1,
        ),
        {
            "error.type": "GatewayTimeoutError",
            "vllm_omni.status_code": 504,
            "vllm_omni.category": "server",
            "vllm_omni.fatal": False,
            "vllm_omni.retryable": True,
            "vllm_omni.error.message": "Stage 1 (thinker) did not finish within 3 s.",
            "vllm_omni.stage_id": 1,
        },
        True,
        id="deadline-504",
    ),
    pytest.param(
        OmniErrorDetails(
            message="EngineCore encountered an issue.",
            category="server",
            status_code=500,
            error_type="InternalServerError",
            request_id="r2",
            stage_id=3,
            fatal=True,
        ),
        {
            "error.type": "InternalServerError",
            "vllm_omni.status_code": 500,
            "vllm_omni.category": "server",
            "vllm_omni.fatal": True,
            "vllm_omni.retryable": False,
            "vllm_omni.error.message": "EngineCore encountered an issue.",
            "vllm_omni.stage_id": 3,
            "vllm_omni.request_id": "r2",
        },
        True,
        id="fatal-500",
    ),
]


@pytest.mark.parametrize(("details", "expected", "error"), CASES)
def test_a_record_as_attributes(
    details: OmniErrorDetails, expected: dict[str, Any], error: bool
) -> None:
    assert record_attributes(details) == expected
    assert is_error(details) is error
