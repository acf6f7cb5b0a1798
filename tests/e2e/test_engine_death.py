"""A stage process really dies (``os._exit(1)`` in the vocoder): in-flight
HTTP requests get 500 with the stage id, a started stream gets its terminal
error event, and the server exits — unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``
keeps it up, in which case ``/health`` is 503 and new requests are 500."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from tests.e2e.omni_server import (
    REFERENCE_STAGES,
    OmniServer,
    start_server,
    write_pipeline,
)
from tests.e2e.servers import api_pids, metric_samples, serving_pid

GENERIC = "The server had an error while processing your request."
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, OmniServer]]:
    root = tmp_path_factory.mktemp("engine-death")
    dying_dir, alive_dir = root / "dying", root / "alive"
    for directory in (dying_dir, alive_dir):
        directory.mkdir()
    # The keep-alive server has no image stage: its image route is a 503.
    no_image = [s for s in REFERENCE_STAGES if s["kind"] != "image"]
    started = {
        "dying": start_server(dying_dir, write_pipeline(dying_dir)),
        "alive": start_server(
            alive_dir,
            write_pipeline(alive_dir, stages=no_image),
            env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
        ),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def _stream_events(base: str, prompt: str, sink: dict[str, Any]) -> None:
    with httpx.stream(
        "POST",
        base + CHAT,
        json={
            "messages": [{"role": "user", "content": prompt}],
            "modalities": ["text", "audio"],
            "stream": True,
        },
        timeout=30,
    ) as response:
        sink["status"] = response.status_code
        sink["events"] = [
            line[len("data: ") :]
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


def _hanging_request(base: str, sink: dict[str, Any]) -> None:
    sink["response"] = httpx.post(
        base + CHAT,
        json={"messages": [{"role": "user", "content": "wait @hang"}]},
        timeout=30,
    )


# The first test of the module also pays for starting both servers (each up
# to wait_ready's 120 s on a loaded machine): the default 300 s timeout.
def test_fatal_stage_failure_fails_in_flight_and_exits(
    servers: dict[str, OmniServer],
) -> None:
    server = servers["dying"]
    base = server.base_url
    plain: dict[str, Any] = {}
    waiter = threading.Thread(target=_hanging_request, args=(base, plain))
    waiter.start()
    time.sleep(0.5)  # the hanging request is now in flight in stage 1

    stream: dict[str, Any] = {}
    _stream_events(base, "speak and @die", stream)
    waiter.join(timeout=20)

    # The stream had started (200) and ends with one error event, then [DONE].
    assert stream["status"] == 200
    events = stream["events"]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 500
    assert error["type"] == "InternalServerError"
    assert error["message"] == GENERIC
    assert error["stage_id"] == 3
    assert error["retryable"] is False  # the engine is dead
    assert sum(1 for e in events if e.startswith('{"error"')) == 1

    # The plain request in flight in another stage got a 500 naming the dead stage.
    response: httpx.Response = plain["response"]
    assert response.status_code == 500
    assert response.json()["error"]["stage_id"] == 3
    assert response.json()["error"]["message"] == GENERIC
    assert response.headers["x-should-retry"] == "false"
    assert "retry-after" not in response.headers

    # And the server exits on its own.
    code = server.proc.wait(timeout=15)
    assert code != 0
    assert "stage 3" in server.log()


@pytest.fixture(scope="module")
def two_api_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    """Two API server processes in front of the dying engine (issue 46)."""
    directory = tmp_path_factory.mktemp("engine-death-two")
    server = start_server(
        directory,
        write_pipeline(directory),
        extra_args=("--api-server-count", "2"),
        env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"},
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


# With the drills (``-m drill``, .ci/run): its own server, not the suite's time.
@pytest.mark.drill
def test_a_dead_stage_fails_the_requests_of_every_api_server_process(
    two_api_servers: OmniServer,
) -> None:
    """With ``--api-server-count 2`` the stage's record reaches the requests
    in flight in each process, and the whole server exits, leaving nothing."""
    server = two_api_servers
    port = urlsplit(server.base_url).port or 0
    pids = api_pids(server.proc.pid, port)
    main = psutil.Process(server.proc.pid)
    tree = [main, *main.children(recursive=True)]
    # One keep-alive connection on each process (the kernel picks).
    clients: dict[int, httpx.Client] = {}
    for _ in range(60):
        http = httpx.Client(base_url=server.base_url, timeout=30)
        pid = serving_pid(http.get("/health"), pids)
        if pid in clients or len(clients) == 2:
            http.close()
            continue
        clients[pid] = http
    assert sorted(clients) == pids
    sinks: list[dict[str, Any]] = [{} for _ in clients]

    def hang(http: httpx.Client, sink: dict[str, Any]) -> None:
        sink["response"] = http.post(
            CHAT, json={"messages": [{"role": "user", "content": "wait @hang"}]}
        )

    waiters = [
        threading.Thread(target=hang, args=(http, sink))
        for http, sink in zip(clients.values(), sinks, strict=True)
    ]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.5)  # both are in flight in stage 1
    died = httpx.post(
        server.base_url + CHAT,
        json={
            "messages": [{"role": "user", "content": "speak and @die"}],
            "modalities": ["text", "audio"],
        },
        timeout=30,
    )
    for waiter in waiters:
        waiter.join(timeout=20)
    for response in [died] + [sink["response"] for sink in sinks]:
        assert response.status_code == 500
        error = response.json()["error"]
        assert (error["stage_id"], error["message"]) == (3, GENERIC)
        assert response.headers["x-should-retry"] == "false"
    for http in clients.values():
        http.close()
    assert server.proc.wait(timeout=30) == 1
    time.sleep(0.5)
    alive = [p.pid for p in tree if p.is_running() and p.status() != "zombie"]
    assert alive == [], alive
    log = server.log()
    critical = [line for line in log.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1 and " engine " in critical[0], critical


def test_keep_alive_serves_503_health_and_500s(servers: dict[str, OmniServer]) -> None:
    base = servers["alive"].base_url
    missing = httpx.post(base + "/v1/images/generations", json={"prompt": "fox"})
    assert missing.status_code == 503
    assert missing.json()["error"]["type"] == "ServiceUnavailableError"

    died = httpx.post(
        base + CHAT,
        json={
            "messages": [{"role": "user", "content": "speak and @die"}],
            "modalities": ["text", "audio"],
        },
        timeout=30,
    )
    assert died.status_code == 500
    assert died.json()["error"]["stage_id"] == 3
    assert died.headers["x-should-retry"] == "false"

    deadline = time.monotonic() + 5
    while httpx.get(base + "/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    health = httpx.get(base + "/health")
    assert health.json()["error"]["code"] == 503

    after = httpx.post(
        base + CHAT, json={"messages": [{"role": "user", "content": "anyone?"}]}
    )
    assert after.status_code == 500
    assert after.json()["error"]["type"] == "InternalServerError"
    assert after.json()["error"]["message"] == GENERIC
    assert after.headers["x-should-retry"] == "false"
    time.sleep(1)
    assert servers["alive"].proc.poll() is None


def test_logs_name_the_stage(servers: dict[str, OmniServer]) -> None:
    assert "engine dead: stage 3 failed fatally" in servers["alive"].log()


def test_death_is_logged_once_and_later_refusals_at_info(
    servers: dict[str, OmniServer],
) -> None:
    server = servers["alive"]
    base = server.base_url
    offset = len(server.log())
    for index in range(3):
        refused = httpx.post(
            base + CHAT,
            json={"messages": [{"role": "user", "content": "still there?"}]},
            headers={"X-Request-Id": f"after-death-{index}"},
        )
        assert refused.status_code == 500
        assert refused.json()["error"]["message"] == GENERIC
    log = server.log()
    critical = [line for line in log.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1, critical
    assert (
        "engine dead: stage 3 (vocoder) failed fatally: stage process" in (critical[0])
    )
    later = log[offset:].splitlines()
    assert not [line for line in later if "ERROR" in line or "Traceback" in line]
    for index in range(3):
        mentions = [line for line in later if f"after-death-{index}" in line]
        assert len(mentions) == 1 and " INFO " in mentions[0]
        assert "(engine dead)" in mentions[0]
    samples = metric_samples(base)
    assert samples[("vllm_omni:engine_dead", ())] == 1
