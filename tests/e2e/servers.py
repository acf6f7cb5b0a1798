"""Helpers for end-to-end tests: free loopback ports, uvicorn in a thread,
Prometheus text parsed with ``prometheus_client.parser``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from tests.ports import free_port


@contextmanager
def serve_in_thread(app: ASGIApp, *, timeout: float = 20.0) -> Iterator[str]:
    """Run ``app`` under real uvicorn on a free loopback port; yield its URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_until_up(url: str, *, path: str = "/v1/ok", timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def metric_samples(
    base_url: str,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """All samples of ``/metrics``, keyed by (sample name, sorted labels)."""
    text = httpx.get(base_url + "/metrics", timeout=5.0).text
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample_delta(
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    after: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    **labels: str,
) -> float:
    """Sum of the growth of every sample named ``name`` matching ``labels``."""
    total = 0.0
    for key, value in after.items():
        sample_name, sample_labels = key
        if sample_name != name:
            continue
        present = dict(sample_labels)
        if all(present.get(k) == v for k, v in labels.items()):
            total += value - before.get(key, 0.0)
    return total


def settled_samples(
    base_url: str,
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    expected: float,
    *,
    timeout: float = 3.0,
    **labels: str,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Metrics once ``name{labels}`` grew by ``expected`` (or the timeout passed).

    The instrumentator counts a request after its response is sent, so a
    client can read ``/metrics`` a moment before the count lands.
    """
    deadline = time.monotonic() + timeout
    while True:
        after = metric_samples(base_url)
        grown = sample_delta(before, after, name, **labels)
        if grown >= expected or time.monotonic() > deadline:
            return after
        time.sleep(0.02)


def assert_http_error_counted(
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    after: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    *,
    handler: str,
    status: int,
    error_type: str,
) -> None:
    """One request on ``handler``, in the status group the client saw, and one
    rendered error in ``vllm_omni:errors_total`` with the same status and type."""
    group = f"{status // 100}xx"
    assert sample_delta(before, after, "http_requests_total", handler=handler) == 1
    assert (
        sample_delta(
            before, after, "http_requests_total", handler=handler, status=group
        )
        == 1
    )
    category = "client" if status < 500 else "server"
    assert (
        sample_delta(
            before,
            after,
            "vllm_omni:errors_total",
            transport="http",
            category=category,
            type=error_type,
            code=str(status),
        )
        == 1
    )


def api_pids(
    server_pid: int, port: int, count: int = 2, within_s: float = 60.0
) -> list[int]:
    """The ``count`` API server processes of ``vllm-omni serve
    --api-server-count N`` (``server_pid``): its children that listen on
    ``port``. Each listens on a socket of its own once it serves, so a
    server that answers already may have fewer listening: wait for all."""
    deadline = time.monotonic() + within_s
    while True:
        pids = []
        for child in psutil.Process(server_pid).children():
            listening = [
                c
                for c in child.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            ]
            if listening:
                pids.append(child.pid)
        if len(pids) >= count or time.monotonic() > deadline:
            return sorted(pids)
        time.sleep(0.1)


def serving_pid(response: httpx.Response, pids: list[int]) -> int:
    """The process that owns the server end of ``response``'s connection."""
    local = response.extensions["network_stream"].get_extra_info("client_addr")[1]
    for pid in pids:
        for conn in psutil.Process(pid).net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port == local:
                return pid
    raise AssertionError(f"no API server process holds the connection from {local}")
