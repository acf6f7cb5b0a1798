"""The HTTP boundary end to end: real uvicorn, the OpenAI SDK, real metrics.

For every row of the status table (and the raw exceptions) a route raises;
the response status must equal ``error.code``, the body must be the canonical
envelope, the retry guidance must be the documented one (``x-should-retry``,
``Retry-After`` exactly when it is ``true``), and ``http_requests_total``
must grow by exactly one in the status group the client saw — in strict and
legacy mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.servers import (
    assert_http_error_counted,
    free_port,
    metric_samples,
    sample_delta,
    settled_samples,
    wait_until_up,
)

GENERIC = "The server had an error while processing your request."

# name: (status, error.type, param, public message or None to skip, stage_id)
STRICT: dict[str, tuple[int, str, str | None, str | None, int | None]] = {
    "validation": (
        400,
        "BadRequestError",
        "temperature",
        "temperature must be at most 2",
        None,
    ),
    "not_found": (404, "NotFoundError", None, "The model `nope` does not exist.", None),
    "lora_not_found": (
        404,
        "NotFoundError",
        None,
        "Loading lora a failed: No adapter found for <path>",
        None,
    ),
    "unprocessable": (
        422,
        "UnprocessableEntityError",
        "image",
        "image could not be decoded",
        None,
    ),
    "chat_template": (400, "BadRequestError", None, "no chat template", None),
    "client": (400, "BadRequestError", None, "bad request", None),
    "guardrail": (
        400,
        "GuardrailViolationError",
        None,
        "prompt blocked by guardrail",
        None,
    ),
    "conflict": (409, "ConflictError", None, "job is still running", None),
    "omni_client_404": (404, "NotFoundError", None, "voice not found", None),
    "generation": (500, "InternalServerError", None, "KV cache load failed", None),
    "retryable": (
        503,
        "ServiceUnavailableError",
        None,
        "Request failed; please retry",
        None,
    ),
    "queue_overflow": (503, "Service Unavailable", None, None, None),
    "profiler_active": (409, "Conflict", None, None, None),
    "engine_generate": (
        500,
        "InternalServerError",
        None,
        "request failed in engine",
        None,
    ),
    "omni_engine_generate": (500, "InternalServerError", None, "stage failed", 1),
    "server": (500, "InternalServerError", None, "server-side failure", None),
    "not_implemented": (
        501,
        "NotImplementedError",
        None,
        "remix is not implemented",
        None,
    ),
    "unavailable": (
        503,
        "ServiceUnavailableError",
        None,
        "pipeline has no audio stage",
        None,
    ),
    "stage_timeout": (504, "GatewayTimeoutError", None, "stage 2 deadline", 2),
    "omni_server_502": (
        502,
        "BadGatewayError",
        None,
        "upstream stage host failed",
        None,
    ),
    "vllm_error": (500, "InternalServerError", None, GENERIC, None),
    "key_error": (500, "InternalServerError", None, GENERIC, None),
    "value_error": (500, "InternalServerError", None, GENERIC, None),
    "type_error": (500, "InternalServerError", None, GENERIC, None),
    "overflow_error": (500, "InternalServerError", None, GENERIC, None),
    "raw_not_implemented": (500, "InternalServerError", None, GENERIC, None),
    "asyncio_timeout": (500, "InternalServerError", None, GENERIC, None),
    "str_raises": (500, "InternalServerError", None, GENERIC, None),
}
LEGACY_CHANGES = {
    "value_error": (400, "BadRequestError", None, "internal parse failure", None),
    "type_error": (400, "BadRequestError", None, "internal type mix-up", None),
    "overflow_error": (400, "BadRequestError", None, "too big", None),
    "raw_not_implemented": (501, "NotImplementedError", None, GENERIC, None),
}
LEGACY = {**STRICT, **LEGACY_CHANGES}


def should_retry(status: int) -> bool:
    """The documented rule (status-mapping.md, Retry guidance) for the records
    these routes raise; none is fatal (engine death has its own test)."""
    return status in (408, 429) or (status >= 500 and status != 501)


FALLBACK_LABEL = {
    "value_error": "ValueError",
    "type_error": "TypeError",
    "overflow_error": "OverflowError",
    "raw_not_implemented": "NotImplementedError",
}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """Three real uvicorn processes, started together to share the import cost.

    One process per mode, because each app mounts the instrumentator on the
    default registry (as vLLM does) and a registry holds one
    ``http_requests_total``. ``strict`` keeps serving after engine death
    (``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``); ``dying`` must exit on it.
    """
    procs = {
        "strict": _spawn_app_process({"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}),
        "legacy": _spawn_app_process({}, "legacy"),
        "dying": _spawn_app_process({"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "0"}),
    }
    try:
        for _, base in procs.values():
            wait_until_up(base)
        _PROCS.update(procs)
        yield {mode: base for mode, (_, base) in procs.items()}
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            proc.log.close()  # type: ignore[attr-defined]


_PROCS: dict[str, tuple[subprocess.Popen[bytes], str]] = {}


def _check_case(base: str, name: str, expected: tuple[Any, ...]) -> httpx.Response:
    status, error_type, param, message, stage_id = expected
    handler = "/v1/raise/{name}"
    before = metric_samples(base)
    response = httpx.post(
        f"{base}/v1/raise/{name}", headers={"X-Request-Id": f"req-{name}"}
    )
    after = settled_samples(base, before, "http_requests_total", 1, handler=handler)

    body = response.json()
    assert response.status_code == status
    assert body["error"]["code"] == response.status_code
    assert set(body) == {"error"}
    error = body["error"]
    assert error["type"] == error_type
    assert error["param"] == param
    if message is not None:
        assert error["message"] == message
    assert error["request_id"] == f"req-{name}"
    assert response.headers.get_list("x-request-id") == [f"req-{name}"]
    retry = should_retry(status)
    assert response.headers.get_list("x-should-retry") == [str(retry).lower()]
    assert response.headers.get_list("retry-after") == (["1"] if retry else [])
    assert error.get("stage_id") == stage_id
    # ``error_stage_id``: 0.30's name, kept for one release (issue 22).
    assert error.get("error_stage_id") == stage_id
    expected_keys = {"message", "type", "param", "code", "request_id"}
    assert set(error) == expected_keys | (
        {"stage_id", "error_stage_id"} if stage_id is not None else set()
    )

    assert_http_error_counted(
        before, after, handler=handler, status=status, error_type=error_type
    )
    return response


@pytest.mark.parametrize("name", sorted(STRICT))
def test_strict_mode_status_equals_code_and_metrics(
    servers: dict[str, str], name: str
) -> None:
    base = servers["strict"]
    before = metric_samples(base)
    _check_case(base, name, STRICT[name])
    after = metric_samples(base)
    assert sample_delta(before, after, "vllm_omni:raw_error_fallbacks_total") == 0


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_mode_fallbacks(servers: dict[str, str], name: str) -> None:
    base = servers["legacy"]
    before = metric_samples(base)
    _check_case(base, name, LEGACY[name])
    after = metric_samples(base)
    moved = sample_delta(before, after, "vllm_omni:raw_error_fallbacks_total")
    if name in FALLBACK_LABEL:
        assert moved == 1
        assert (
            sample_delta(
                before,
                after,
                "vllm_omni:raw_error_fallbacks_total",
                exception=FALLBACK_LABEL[name],
            )
            == 1
        )
    else:
        assert moved == 0


def test_framework_errors_use_the_envelope(servers: dict[str, str]) -> None:
    base = servers["strict"]
    missing = httpx.get(f"{base}/v1/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundError"
    assert missing.json()["error"]["code"] == 404
    assert missing.headers["x-request-id"] == missing.json()["error"]["request_id"]

    assert missing.headers["x-should-retry"] == "false"

    wrong_method = httpx.get(f"{base}/v1/raise/client")
    assert wrong_method.status_code == 405
    assert wrong_method.headers["x-should-retry"] == "false"
    assert wrong_method.json()["error"] == {
        "message": "Method Not Allowed",
        "type": "MethodNotAllowedError",
        "param": None,
        "code": 405,
        "request_id": wrong_method.headers["x-request-id"],
    }

    invalid = httpx.post(
        f"{base}/v1/validated", json={"temperature": 7, "prompt": "sk-secret-999"}
    )
    assert invalid.status_code == 400
    error = invalid.json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["param"] == "temperature"
    assert error["code"] == 400
    assert "7" not in error["message"].replace("temperature", "")
    assert "sk-secret" not in invalid.text


def test_request_id_is_sanitized(servers: dict[str, str]) -> None:
    base = servers["strict"]
    hostile = httpx.post(
        f"{base}/v1/raise/client",
        headers={"X-Request-Id": "../../etc/passwd; rm -rf /"},
    )
    rid = hostile.json()["error"]["request_id"]
    assert rid == hostile.headers["x-request-id"]
    assert "passwd" not in rid and len(rid) == 32


# -- the official OpenAI SDK as the client ------------------------------------

SDK_CLASSES: dict[str, type[openai.APIStatusError]] = {
    "validation": openai.BadRequestError,
    "not_found": openai.NotFoundError,
    "conflict": openai.ConflictError,
    "unprocessable": openai.UnprocessableEntityError,
    "server": openai.InternalServerError,
    "omni_engine_generate": openai.InternalServerError,
    "not_implemented": openai.InternalServerError,
    "unavailable": openai.InternalServerError,
    "stage_timeout": openai.InternalServerError,
    "key_error": openai.InternalServerError,
}


@pytest.mark.parametrize("name", sorted(SDK_CLASSES))
def test_openai_sdk_raises_matching_class(servers: dict[str, str], name: str) -> None:
    client = openai.OpenAI(
        base_url=servers["strict"] + "/v1", api_key="k", max_retries=0
    )
    with pytest.raises(openai.APIStatusError) as caught:
        client.post(f"/raise/{name}", cast_to=object)
    exc = caught.value
    assert type(exc) is SDK_CLASSES[name]
    status = STRICT[name][0]
    assert exc.status_code == status
    assert isinstance(exc.body, dict)
    assert exc.body["code"] == status
    assert exc.body["type"] == STRICT[name][1]
    assert exc.body["param"] == STRICT[name][2]
    assert exc.body["request_id"] == exc.response.headers["x-request-id"]


def test_success_has_one_request_id(servers: dict[str, str]) -> None:
    base = servers["strict"]
    fresh = httpx.get(f"{base}/v1/ok")
    assert fresh.status_code == 200
    (generated,) = fresh.headers.get_list("x-request-id")
    assert len(generated) == 32
    assert "x-should-retry" not in fresh.headers
    named = httpx.get(f"{base}/v1/ok", headers={"X-Request-Id": "mine-1"})
    assert named.headers.get_list("x-request-id") == ["mine-1"]
    metrics = httpx.get(f"{base}/metrics")
    assert len(metrics.headers.get_list("x-request-id")) == 1


# -- leaks ---------------------------------------------------------------------

SECRETS = (
    "/home/alice",
    "/srv/app",
    "Traceback",
    'File "',
    "abcDEF123.secret",
    "sk-proj-SECRET123456",
    "sk-live-123",
    "iVBORw0KGgo",
    "data:image/png",
    "hf_SECRETVALUE123",
)


def test_nothing_private_leaks(servers: dict[str, str]) -> None:
    base = servers["strict"]
    names = [n for n in STRICT] + [
        "leak_path",
        "leak_traceback",
        "leak_bearer",
        "leak_sk",
        "leak_data_uri",
        "leak_value",
    ]
    for name in names:
        response = httpx.post(f"{base}/v1/raise/{name}")
        public = response.text + "\n".join(
            f"{k}: {v}" for k, v in response.headers.items()
        )
        for secret in SECRETS:
            assert secret not in public, (name, secret)
    metrics_text = httpx.get(base + "/metrics").text
    for secret in SECRETS:
        assert secret not in metrics_text


# -- engine death: a real uvicorn process that must exit -----------------------


def _spawn_app_process(
    env_extra: dict[str, str], mode: str = "strict"
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = ["-m", "tests.e2e.boundary_app", "--port", str(port), "--mode", mode]
    # The log goes to a file: an unread pipe would fill and block the server.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        env={**os.environ, **env_extra},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    proc.log = log  # type: ignore[attr-defined]
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.timeout(60)
def test_engine_death_terminates_server_and_keep_alive_keeps_it(
    servers: dict[str, str],
) -> None:
    dying, _ = _PROCS["dying"]
    for base in (servers["dying"], servers["strict"]):
        response = httpx.post(f"{base}/v1/raise/engine_dead")
        assert response.status_code == 500
        assert response.json()["error"] == {
            "message": GENERIC,
            "type": "InternalServerError",
            "param": None,
            "code": 500,
            "request_id": response.headers["x-request-id"],
            "stage_id": 3,
            "error_stage_id": 3,
        }
        # Dead (terminating, or kept alive dead): a retry cannot help.
        assert response.headers["x-should-retry"] == "false"
        assert "retry-after" not in response.headers
    started = time.monotonic()
    assert dying.wait(timeout=5) is not None
    assert time.monotonic() - started < 5
    dying.log.seek(0)  # type: ignore[attr-defined]
    assert "engine dead: stage 3 failed fatally" in dying.log.read().decode()  # type: ignore[attr-defined]

    strict, _ = _PROCS["strict"]
    assert strict.poll() is None
    assert httpx.get(f"{servers['strict']}/v1/ok").status_code == 200


def test_log_lines(servers: dict[str, str]) -> None:
    """5xx: one ERROR line with request id, class and traceback; 4xx: INFO, no trace."""
    base = servers["strict"]
    httpx.post(f"{base}/v1/raise/key_error", headers={"X-Request-Id": "log-5xx"})
    httpx.post(f"{base}/v1/raise/client", headers={"X-Request-Id": "log-4xx"})
    proc, _ = _PROCS["strict"]
    deadline = time.monotonic() + 5
    while True:
        proc.log.seek(0)  # type: ignore[attr-defined]
        log = proc.log.read().decode()  # type: ignore[attr-defined]
        if "log-4xx" in log or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    lines = log.splitlines()
    error_lines = [line for line in lines if "request log-5xx" in line]
    assert error_lines == [
        "ERROR vllm_omni.errors: request log-5xx failed with 500 "
        "InternalServerError: KeyError"
    ]
    after = lines[lines.index(error_lines[0]) + 1]
    assert after.startswith("Traceback (most recent call last)")
    info_lines = [line for line in lines if "request log-4xx" in line]
    assert info_lines == [
        "INFO vllm_omni.errors: request log-4xx rejected with 400 BadRequestError"
    ]
    following = lines[lines.index(info_lines[0]) + 1 :][:1]
    assert not any(line.startswith("Traceback") for line in following)
