"""Reading the engine's ``vllm:*`` families from a server's ``/metrics``, and
the one request a drill lets its client abandon, as a user's client does.

Upstream's own server keeps vLLM's metrics in one process, whose
prometheus_client adds a ``<name>_created`` sample to every counter and
histogram; the text format has no such type, so the parser reads each one as
a gauge family of its own. ``vllm serve`` with several API servers (the
multiprocess mode our stages use) has none: they are left out of the
comparison (``engine_families``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.omni_server import OmniServer
from tests.real_engine.pause import engine_core_pid

ENGINE_PREFIX = "vllm:"
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def metrics_text(server: OmniServer) -> str:
    response = httpx.get(server.base_url + "/metrics", timeout=10)
    assert response.status_code == 200
    return response.text


def engine_families(text: str) -> dict[str, Any]:
    """The ``vllm:`` families of an exposition text, by name, without the
    ``_created`` pseudo-families of a single-process registry."""
    families = {
        family.name: family
        for family in text_string_to_metric_families(text)
        if family.name.startswith(ENGINE_PREFIX)
    }
    created = {
        f"{name}_created"
        for name, family in families.items()
        if family.type in ("counter", "histogram")
    }
    return {name: f for name, f in families.items() if name not in created}


def engine_gauges(text: str) -> list[str]:
    """The names of the ``vllm:`` gauge families of an exposition text."""
    return [f.name for f in engine_families(text).values() if f.type == "gauge"]


def label_names(family: Any) -> set[str]:
    return {name for sample in family.samples for name in sample.labels}


def success_by_reason(text: str) -> dict[str, float]:
    """``vllm:request_success_total`` summed per ``finished_reason``."""
    totals = dict.fromkeys(FINISH_REASONS, 0.0)
    family = engine_families(text)["vllm:request_success"]
    for sample in family.samples:
        if sample.name == "vllm:request_success_total":
            totals[sample.labels["finished_reason"]] += sample.value
    return totals


def counter_total(text: str, name: str) -> float:
    """The sum of a counter family's ``_total`` samples."""
    family = engine_families(text)[name]
    return sum(s.value for s in family.samples if s.name == f"{name}_total")


@contextlib.contextmanager
def engine_core_stopped(server: OmniServer) -> Iterator[None]:
    """The server's EngineCore stopped (``SIGSTOP``): what its frontend sends
    it (a request, then its abort) waits in its input socket, and is read
    in order once it runs again; nothing is scheduled in between."""
    pid = engine_core_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def abandon_a_request(
    server: OmniServer, model: str, aborted: Callable[[], None]
) -> None:
    """A chat completion whose client gives up (the SDK's timeout closes the
    connection) while the engine is stopped, so it never runs; ``aborted``
    waits until the server has passed the abort on to the engine."""
    client = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=2.0
    )
    with engine_core_stopped(server):
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=4,
            )
        aborted()
    # The EngineCore reads the request and its abort; nothing finishes.
    time.sleep(1.0)
