"""Tracing on or off (``vllm_omni.tracing.provider``): the endpoint from the
flag or the standard environment, the protocol as vLLM reads it, and a
collector that is down logged once. What turns tracing on runs in a process
of its own: it is on for the rest of a process's life."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.servers import free_port
from vllm_omni.errors import VLLMValidationError
from vllm_omni.tracing import provider
from vllm_omni.tracing.hooks import OFF, request_span, stage_span, submission_headers

ROOT = Path(__file__).resolve().parents[2]
OTEL_ENV = (
    provider.ENDPOINT_ENV,
    provider.GENERIC_ENDPOINT_ENV,
    provider.PROTOCOL_ENV,
    provider.DISABLED_ENV,
)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OTEL_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {}, None),
        ("http://c:4317", {}, "http://c:4317"),
        (
            None,
            {provider.ENDPOINT_ENV: "http://t:4318/v1/traces"},
            "http://t:4318/v1/traces",
        ),
        ("http://flag", {provider.ENDPOINT_ENV: "http://env"}, "http://flag"),
        (None, {provider.GENERIC_ENDPOINT_ENV: "http://g:4317"}, "http://g:4317"),
        (
            None,
            {
                provider.GENERIC_ENDPOINT_ENV: "http://g:4318/",
                provider.PROTOCOL_ENV: "http/protobuf",
            },
            "http://g:4318/v1/traces",
        ),
        ("http://flag", {provider.DISABLED_ENV: "true"}, None),
    ],
)
def test_the_endpoint_is_the_flag_else_the_environment(
    clean_env: pytest.MonkeyPatch,
    flag: str | None,
    env: dict[str, str],
    expected: str | None,
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert provider.resolve_endpoint(flag) == expected


def test_an_unknown_protocol_is_refused_by_name(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv(provider.PROTOCOL_ENV, "http/json")
    with pytest.raises(VLLMValidationError) as caught:
        provider.protocol()
    assert caught.value.parameter == provider.PROTOCOL_ENV


def test_off_the_hooks_do_nothing_and_import_nothing() -> None:
    """(Another test of the same process may have imported the SDK: what
    the hooks import is what they add; tests/tracing/test_tracing_off.py
    checks a fresh server process.)"""
    before = set(sys.modules)
    assert not provider.enabled()
    assert stage_span("r", None, stage_id=1, name="thinker", kind="text") is OFF
    assert request_span("r", {"traceparent": TRACEPARENT}) is OFF
    # A caller's headers still travel, for a vllm stage's own engine span.
    given = {"traceparent": TRACEPARENT, "authorization": "Bearer x"}
    assert submission_headers(given) == {"traceparent": TRACEPARENT}
    assert OFF.headers({"traceparent": TRACEPARENT}) == {"traceparent": TRACEPARENT}
    assert not [
        name
        for name in set(sys.modules) - before
        if name.startswith("opentelemetry.sdk")
    ]


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_collector_that_is_down_is_logged_once() -> None:
    down = f"http://127.0.0.1:{free_port()}/v1/traces"
    done = _run(
        f"""
        import logging
        logging.basicConfig(level=logging.INFO)
        from vllm_omni.tracing import provider
        from vllm_omni.tracing.hooks import stage_span
        assert provider.configure({down!r}, process="test")
        for batch in range(3):
            for n in range(5):
                span = stage_span(f"r{{n}}", None, stage_id=1, name="t", kind="text")
                span.finish()
            provider.flush(30)
        """,
        {
            provider.PROTOCOL_ENV: "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1",
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failures = [line for line in done.stderr.splitlines() if "trace export to" in line]
    assert len(failures) == 1, done.stderr[-3000:]
    assert down in failures[0]
    assert "Traceback" not in done.stderr
