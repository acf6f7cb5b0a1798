"""Contract fuzzing of the real server with schemathesis, from its own OpenAPI.

Bounded examples per operation. Every response must be one the document
declares (status, content type, schema), no malformed input may produce a
5xx, and every error body must be the canonical envelope with
``code == status``.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode, checks

from tests.e2e.canonical import assert_canonical_error
from tests.e2e.omni_server import OmniServer

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


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
        case.validate_response(response, checks=checks_for_operation)
        if response.status_code >= 400:
            assert_canonical_error(
                response.status_code, response.json(), response.headers
            )

    run()


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
