"""The contract's checks, stated once for every test of vllm-omni's app.

The canonical envelope is the one of docs/errors/http.md: the OpenAI error
object vLLM uses (``message``, ``type``, ``param``, ``code``) plus, when
known, the request id and the stage id (``error_stage_id``: 0.30's name
of it); ``type`` is the status's OpenAI type (or an Omni type of that
status).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
import scenarios
from prometheus_client.parser import text_string_to_metric_families

REQUIRED = ("message", "type", "param", "code")
OPTIONAL = ("request_id", "stage_id", "error_stage_id", "retryable")
TYPES: Mapping[int, frozenset[str]] = {
    400: frozenset({"BadRequestError", "GuardrailViolationError"}),
    404: frozenset({"NotFoundError"}),
    409: frozenset({"ConflictError"}),
    422: frozenset({"UnprocessableEntityError"}),
    500: frozenset({"InternalServerError"}),
    501: frozenset({"NotImplementedError"}),
    503: frozenset({"ServiceUnavailableError"}),
    504: frozenset({"GatewayTimeoutError"}),
}
LEAKS = {
    "a traceback": "Traceback (most recent call last)",
    "a path": scenarios.PATH,
    "a secret": scenarios.SECRET,
    "a rejected value": scenarios.REJECTED,
}


def assert_canonical(error: Any, status: int) -> None:
    """``error`` is the canonical inner error object of a ``status``."""
    assert isinstance(error, dict), f"no error object: {error!r}"
    keys = set(error)
    assert set(REQUIRED) <= keys, f"missing {set(REQUIRED) - keys}: {error}"
    assert keys <= {*REQUIRED, *OPTIONAL}, (
        f"unknown fields {keys - {*REQUIRED, *OPTIONAL}}"
    )
    assert error["code"] == status, f"error.code {error['code']} != {status}"
    assert error["type"] in TYPES[status], (
        f"type {error['type']!r} is not the type of a {status}: {sorted(TYPES[status])}"
    )
    assert isinstance(error["message"], str) and error["message"].strip(), (
        f"empty message: {error}"
    )
    assert error["param"] is None or isinstance(error["param"], str)


def assert_envelope(response: httpx.Response) -> dict[str, Any]:
    """The response is one canonical envelope of its status; its error."""
    body = response.json()
    assert set(body) == {"error"}, f"not one envelope: {body}"
    assert_canonical(body["error"], response.status_code)
    error: dict[str, Any] = body["error"]
    return error


def assert_no_leak(text: str) -> None:
    """Nothing private in a body (or a stream, or a stored job)."""
    found = [what for what, needle in LEAKS.items() if needle in text]
    assert not found, f"the body shows {', '.join(found)}: {text[:600]}"


def requests_total(base_url: str, handler: str) -> dict[str, float]:
    """``http_requests_total`` of one handler, by status label."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "http_requests":
            continue
        for sample in family.samples:
            if (
                sample.name == "http_requests_total"
                and sample.labels.get("handler") == handler
            ):
                status = sample.labels["status"]
                counts[status] = counts.get(status, 0.0) + sample.value
    return counts


def status_label(status: int) -> str:
    """The instrumentator's label (it groups statuses: ``4xx``)."""
    return f"{status // 100}xx"


def sse_events(lines: Iterable[str]) -> list[Any]:
    """The ``data:`` payloads of an SSE stream (``[DONE]`` kept as text)."""
    events: list[Any] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
