"""``--api-server-count 2`` (issue 46): two API server processes on one port
in front of one pipeline behave as one server.

Each client here holds one keep-alive connection, so one API server process
serves it; which one is read from the kernel (the process that owns the
accepted socket), never from the server's own word. Statuses, records and
``/metrics`` (scraped through either process) agree; a video job created
through one process is read, listed, downloaded and deleted through the
other; admission counts the whole server's requests; a killed API server
process stops the whole server, leaving nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from tests.e2e.omni_server import FAULTS, OmniServer, start_server, write_pipeline
from tests.e2e.servers import api_pids, sample_delta, serving_pid

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning"),
]

API_KEY = "asc-key-0123456789"
LIMIT = 4
VIDEO = 5
RETENTION_S = 3
BUSY = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
GENERIC = "The server had an error while processing your request."
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("api-servers")
    started = start_server(
        directory,
        write_pipeline(
            directory,
            faults=[*FAULTS, {"stage": VIDEO, "marker": "@vhang", "action": "hang"}],
        ),
        api_key=API_KEY,
        # Pinned connections stay open between the steps of a test.
        env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"},
        extra_args=(
            "--api-server-count",
            "2",
            "--max-num-queued-reqs",
            str(LIMIT),
            "--job-retention",
            str(RETENTION_S),
        ),
    )
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


@dataclass
class Pinned:
    """One keep-alive connection, served by the API server process ``pid``."""

    pid: int
    http: httpx.Client
    sdk: openai.OpenAI

    def served_by(self, pids: list[int]) -> int:
        return serving_pid(self.http.get("/health"), pids)

    def metrics(self) -> Samples:
        response = self.http.get("/metrics")
        assert response.status_code == 200
        samples: Samples = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = sample.value
        return samples


@pytest.fixture(scope="module")
def pinned(server: OmniServer) -> Iterator[dict[int, Pinned]]:
    """A client on each API server process (new connections until both are
    found: the kernel gives each accepted connection to one of them)."""
    pids = api_pids(server.proc.pid, urlsplit(server.base_url).port or 0)
    assert len(pids) == 2, pids
    found: dict[int, Pinned] = {}
    spare: list[httpx.Client] = []
    for _ in range(60):
        http = httpx.Client(
            base_url=server.base_url,
            headers=server.headers(),
            timeout=30.0,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        pid = serving_pid(http.get("/health"), pids)
        if pid in found:
            spare.append(http)
            continue
        sdk = openai.OpenAI(
            base_url=server.base_url + "/v1",
            api_key=API_KEY,
            max_retries=0,
            http_client=http,
        )
        found[pid] = Pinned(pid, http, sdk)
        if len(found) == 2:
            break
    for http in spare:
        http.close()
    assert len(found) == 2, "one API server process never accepted a connection"
    yield found
    for client in found.values():
        client.http.close()


def _counts(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def _settled(
    clients: list[Pinned], name: str, grown: float, before: Samples
) -> Samples:
    """Metrics once ``name`` grew by ``grown`` (the instrumentator counts a
    request after its response went out)."""
    deadline = time.monotonic() + 5
    while True:
        after = clients[0].metrics()
        if sample_delta(before, after, name) >= grown or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def test_statuses_records_and_metrics_agree_across_processes(
    server: OmniServer, pinned: dict[int, Pinned]
) -> None:
    clients = list(pinned.values())
    before = clients[0].metrics()
    seen: list[int] = []
    for client in clients:
        reply = client.sdk.chat.completions.create(
            model="omni-reference",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=8,
        )
        assert reply.choices[0].message.content == "You said: hello there"
        seen.append(200)
        with pytest.raises(openai.BadRequestError) as bad:
            client.sdk.chat.completions.create(
                model="omni-reference",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=-5,
            )
        body = bad.value.body
        assert isinstance(body, dict)
        assert (body["param"], body["code"], body["stage_id"]) == ("max_tokens", 400, 1)
        seen.append(400)
        with pytest.raises(openai.NotFoundError):
            client.sdk.chat.completions.create(
                model="no-such-model",
                messages=[{"role": "user", "content": "hi"}],
            )
        seen.append(404)
        with pytest.raises(openai.InternalServerError) as failed:
            client.sdk.chat.completions.create(
                model="omni-reference",
                messages=[{"role": "user", "content": "explode @boom"}],
            )
        body = failed.value.body
        assert isinstance(body, dict)
        assert (body["message"], body["code"], body["stage_id"]) == (GENERIC, 500, 1)
        assert body["request_id"] == failed.value.response.headers["x-request-id"]
        seen.append(500)
        assert client.served_by(sorted(pinned)) == client.pid
        # SSE last: the SDK leaves a stream's connection, the next request
        # may go to either process.
        stream = client.sdk.chat.completions.create(
            model="omni-reference",
            messages=[{"role": "user", "content": "stream it"}],
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "You said: stream it"
        seen.append(200)
        # The first output failed: an error status, not a 200 with an event.
        with pytest.raises(openai.InternalServerError):
            client.sdk.chat.completions.create(
                model="omni-reference",
                messages=[{"role": "user", "content": "explode @boom"}],
                stream=True,
            )
        seen.append(500)
    after = _settled(clients, "http_requests_total", len(seen), before)
    # Either process's /metrics: the same sums over both.
    errors = "vllm_omni:errors_total"
    assert _counts(clients[1].metrics(), errors) == _counts(after, errors)
    for status, codes in (("2xx", (200,)), ("4xx", (400, 404)), ("5xx", (500,))):
        grown = sample_delta(before, after, "http_requests_total", status=status)
        assert grown == sum(seen.count(c) for c in codes), status
    for code in (400, 404, 500):
        grown = sample_delta(before, after, errors, code=str(code), transport="http")
        assert grown == seen.count(code), code
    # Each process logged the rejections it answered, naming itself.
    log = server.log()
    assert "api-server-0 vllm_omni.errors" in log
    assert "api-server-1 vllm_omni.errors" in log


def test_a_websocket_session_runs_on_either_process(
    server: OmniServer, pinned: dict[int, Pinned]
) -> None:
    url = server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"
    for _ in range(2):
        with connect(url, additional_headers=server.headers()) as ws:
            created = json.loads(ws.recv(timeout=10))
            assert created["type"] == "session.created"
            ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "response": {"instructions": "hi ws", "max_tokens": 8},
                    }
                )
            )
            events = []
            while not events or events[-1]["type"] not in ("response.done", "error"):
                events.append(json.loads(ws.recv(timeout=10)))
            assert events[-1]["response"]["status"] == "completed"
            deltas = [e["delta"] for e in events if e["type"] == "response.text.delta"]
            assert "".join(deltas) == "You said: hi ws"


def test_a_video_job_crosses_processes(pinned: dict[int, Pinned]) -> None:
    one, other = pinned.values()
    created = one.sdk.videos.create(prompt="a red ball", seconds="1", size="64x64")
    deadline = time.monotonic() + 60
    video = other.sdk.videos.retrieve(created.id)
    while video.status not in ("completed", "failed"):
        assert time.monotonic() < deadline, video
        time.sleep(0.1)
        video = other.sdk.videos.retrieve(created.id)
    assert video.status == "completed"
    assert created.id in [v.id for v in other.sdk.videos.list(limit=100)]
    content = other.sdk.videos.download_content(created.id).read()
    assert content.startswith(b"GIF8")
    assert one.sdk.videos.delete(created.id).deleted
    with pytest.raises(openai.NotFoundError):
        other.sdk.videos.retrieve(created.id)


def test_a_job_expires_for_every_process(pinned: dict[int, Pinned]) -> None:
    """One retention, one sweep (the engine process's): a finished job's
    ``expires_at`` is the same through either process, and once it passed
    the job is gone through both."""
    one, other = pinned.values()
    created = one.sdk.videos.create(prompt="short-lived", seconds="0.2", size="64x64")
    deadline = time.monotonic() + 30
    while (video := other.sdk.videos.retrieve(created.id)).status != "completed":
        assert time.monotonic() < deadline, video
        time.sleep(0.05)
    seen = [
        client.http.get(f"/v1/videos/{created.id}").json() for client in (one, other)
    ]
    assert (
        seen[0]["expires_at"]
        == seen[1]["expires_at"]
        == (seen[0]["completed_at"] + RETENTION_S)
    )
    time.sleep(max(0.0, seen[0]["expires_at"] + 1 - time.time()))
    for client in (one, other):
        with pytest.raises(openai.NotFoundError):
            client.sdk.videos.retrieve(created.id)
        assert created.id not in [v.id for v in client.sdk.videos.list(limit=100)]


def test_a_job_cancelled_through_another_process_stops(
    pinned: dict[int, Pinned],
) -> None:
    one, other = pinned.values()
    video = one.sdk.videos.create(prompt="forever @vhang", seconds="0.2")
    assert other.sdk.videos.retrieve(video.id).status in ("queued", "in_progress")
    with pytest.raises(openai.ConflictError):
        other.sdk.videos.download_content(video.id)
    cancelled = other.sdk.videos.delete(video.id)
    assert (cancelled.id, cancelled.deleted) == (video.id, False)
    assert one.sdk.videos.retrieve(video.id).status == "cancelled"
    assert one.sdk.videos.delete(video.id).deleted


def _hold(server: OmniServer, request_id: str) -> socket.socket:
    """A chat that hangs in the thinker, on a raw connection of its own (the
    kernel gives it to either process), until the socket is closed."""
    url = urlsplit(server.base_url)
    body = json.dumps({"messages": [{"role": "user", "content": "wait @hang"}]})
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nX-Request-Id: {request_id}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            f"{body}"
        ).encode()
    )
    return sock


def _wait_in_flight(client: Pinned, expected: float) -> None:
    deadline = time.monotonic() + 10
    while client.metrics().get(("vllm_omni:requests_in_flight", ()), 0) != expected:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_request_id_in_flight_is_taken_in_every_process(
    server: OmniServer, pinned: dict[int, Pinned]
) -> None:
    """The engine's table is the one table: the same ``X-Request-Id`` sent
    through both processes while the first is in flight is a 409 in each."""
    one, other = pinned.values()
    held = _hold(server, "same-id-both-processes")
    try:
        _wait_in_flight(one, 1)
        for client in (one, other):
            second = client.http.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "@hang"}]},
                headers={"X-Request-Id": "same-id-both-processes"},
            )
            assert second.status_code == 409, second.text
            assert second.json()["error"]["type"] == "ConflictError"
    finally:
        held.close()
    _wait_in_flight(one, 0)


def test_admission_counts_the_whole_server(
    server: OmniServer, pinned: dict[int, Pinned]
) -> None:
    """``--max-num-queued-reqs`` is the server's: requests that hang in
    either process fill it for both; their clients hanging up abort them in
    the engine, counted once each."""
    one, other = pinned.values()
    before = one.metrics()
    held = [_hold(server, f"hold-{index}") for index in range(LIMIT)]
    try:
        _wait_in_flight(one, LIMIT)
        for client in (one, other):
            refused = client.http.post(
                "/v1/chat/completions",
                json={
                    "model": "omni-reference",
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"]
            error = refused.json()["error"]
            assert (error["type"], error["message"]) == ("Service Unavailable", BUSY)
    finally:
        for sock in held:
            sock.close()
    _wait_in_flight(one, 0)
    after = one.metrics()
    assert sample_delta(before, after, "vllm_omni:admission_rejections_total") == 2
    aborts = "vllm_omni:aborts_total"
    assert sample_delta(before, after, aborts, reason="client_disconnect") == LIMIT
    assert sample_delta(before, after, aborts) == LIMIT


SPREAD_CONNECTIONS = 64


async def test_connections_are_spread_over_the_processes(server: OmniServer) -> None:
    """Clients that connect while one API server process is busy still get
    both: each process has its own queue of new connections, filled evenly
    by the kernel. With one shared queue the process awake at that moment
    took every connection, and kept it (the soak's burst: 193 of 236
    refusals in one process, so the second bought nothing). Here one process
    is stopped while 64 clients connect, then continued; each must hold at
    least a quarter of them (a fair split falls below that with probability
    about 3e-5)."""
    port = urlsplit(server.base_url).port or 0
    pids = api_pids(server.proc.pid, port)
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    os.kill(pids[0], signal.SIGSTOP)
    try:
        streams = await asyncio.gather(
            *(
                asyncio.open_connection("127.0.0.1", port)
                for _ in range(SPREAD_CONNECTIONS)
            )
        )
        await asyncio.sleep(0.2)
    finally:
        os.kill(pids[0], signal.SIGCONT)
    try:
        for _, writer in streams:
            writer.write(request)
        for reader, _ in streams:
            status = await asyncio.wait_for(reader.readline(), 30)
            assert status.startswith(b"HTTP/1.1 200"), status
        ours = {writer.get_extra_info("sockname")[1] for _, writer in streams}
        held = {
            pid: sum(
                1
                for c in psutil.Process(pid).net_connections(kind="tcp")
                if c.raddr and c.raddr.port in ours
            )
            for pid in pids
        }
    finally:
        for _, writer in streams:
            writer.close()
    assert sum(held.values()) == SPREAD_CONNECTIONS, held
    assert min(held.values()) >= SPREAD_CONNECTIONS // 4, held


def test_a_killed_api_server_stops_the_whole_server(server: OmniServer) -> None:
    """As ``vllm serve`` does: one API server process dies, the server
    stops, non-zero, and nothing of it is left (processes, port, files).
    Last in this module: it ends the module's server."""
    main = psutil.Process(server.proc.pid)
    tree = [main, *main.children(recursive=True)]
    # The metrics files every process of the server writes (and keeps open).
    files = [f.path for p in tree for f in p.open_files() if f.path.endswith(".db")]
    metrics_dir = os.path.dirname(files[0])
    assert os.path.basename(metrics_dir) == "metrics", files
    victim = api_pids(server.proc.pid, urlsplit(server.base_url).port or 0)[0]
    os.kill(victim, signal.SIGKILL)
    assert server.proc.wait(timeout=60) == 1
    time.sleep(0.5)
    alive = [
        p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == [], alive
    assert not os.path.exists(os.path.dirname(metrics_dir))
    port = urlsplit(server.base_url).port
    with socket.socket() as probe:
        # As a new server binds (connections of the old one may linger in
        # TIME_WAIT): only a socket still listening there would refuse it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()
    assert f"(pid {victim}) was killed by SIGKILL: stopping the server" in server.log()
