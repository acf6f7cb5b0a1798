"""Overload on every transport (§9): beyond ``--max-num-queued-reqs`` a
request is refused at once with upstream's ``QueueOverflowError`` — 503,
``Retry-After``, counted in ``admission_rejections_total`` — over HTTP, SSE
before the first chunk, a WebSocket event, and a job record; refusals are
logged at INFO, never as tracebacks."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.e2e.omni_server import (
    FAULTS,
    REFERENCE_STAGES,
    OmniServer,
    start_server,
    write_pipeline,
)
from tests.e2e.servers import metric_samples, sample_delta

pytestmark = pytest.mark.timeout(240)

API_KEY = "overload-key-0123456789"
LIMIT = 2
BUSY = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
CHAT = "/v1/chat/completions"
TALKER = 2
VIDEO = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("overload")
    # Long text and talker deadlines: the requests that fill the engine or
    # the talker must hold. The talker admits one request at a time.
    stages = [
        {**s, "timeout_s": 120} if s["kind"] == "text" else s for s in REFERENCE_STAGES
    ]
    stages[TALKER] = {**stages[TALKER], "timeout_s": 120, "max_num_queued_reqs": 1}
    stages[VIDEO] = {**stages[VIDEO], "max_num_queued_reqs": 1}
    started = start_server(
        directory,
        write_pipeline(
            directory,
            stages=stages,
            faults=[*FAULTS, {"stage": VIDEO, "marker": "@vhang", "action": "hang"}],
        ),
        api_key=API_KEY,
        extra_args=("--max-num-queued-reqs", str(LIMIT)),
    )
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def _hold(
    server: OmniServer, index: int, path: str = CHAT, body: Any = None
) -> socket.socket:
    """A request that hangs in a stage (by default a chat in the text stage),
    on a socket we close later."""
    url = urlsplit(server.base_url)
    body = json.dumps(body or {"messages": [{"role": "user", "content": "hold @hang"}]})
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nX-Request-Id: hold-{index}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            f"{body}"
        ).encode()
    )
    return sock


def _in_flight(server: OmniServer) -> float:
    return metric_samples(server.base_url)[("vllm_omni:requests_in_flight", ())]


def _wait_in_flight(server: OmniServer, expected: float) -> None:
    deadline = time.monotonic() + 10
    while _in_flight(server) != expected:
        assert time.monotonic() < deadline, _in_flight(server)
        time.sleep(0.05)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _503s_by_transport(
    before: Samples, after: Samples, transports: tuple[str, ...]
) -> dict[str, float]:
    """Growth of ``errors_total`` 503s per transport between two scrapes."""
    return {
        transport: sample_delta(
            before,
            after,
            "vllm_omni:errors_total",
            transport=transport,
            code="503",
            type="Service Unavailable",
        )
        for transport in transports
    }


def _engine_refusals(before: Samples, after: Samples) -> float:
    """Growth of the engine-wide limit's ``admission_rejections_total``."""
    return sample_delta(
        before,
        after,
        "vllm_omni:admission_rejections_total",
        reason="max_num_queued_reqs",
        stage="",
    )


def _job_until_finished(server: OmniServer, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        job = httpx.get(
            server.base_url + f"/v1/videos/{job_id}", headers=server.headers()
        ).json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def _ws_refused(
    server: OmniServer,
    headers: dict[str, str],
    response: dict[str, Any],
    check: Callable[[dict[str, Any]], None],
) -> list[str]:
    """Send one ``response.create`` on a new realtime session: the refusal is
    one error event (``check``-ed), then close code 1013 (try again later).
    Returns the types of the events before the error."""
    ws_url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    with connect(ws_url, additional_headers=headers) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(
            json.dumps(
                {"type": "response.create", "event_id": "e1", "response": response}
            )
        )
        before: list[str] = []
        event = json.loads(ws.recv(timeout=10))
        while event["type"] != "error":
            before.append(event["type"])
            event = json.loads(ws.recv(timeout=10))
        assert event["event_id"] == "e1"
        check(event["error"])
        # No header to read on a WebSocket: the event says it.
        assert event["error"]["retryable"] is True
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    return before


def _assert_busy(error: dict[str, Any]) -> None:
    assert {k: error[k] for k in ("message", "type", "param", "code")} == {
        "message": BUSY,
        "type": "Service Unavailable",
        "param": None,
        "code": 503,
    }


def test_refused_on_every_transport_then_served(server: OmniServer) -> None:
    holders = [_hold(server, i) for i in range(LIMIT)]
    try:
        _wait_in_flight(server, LIMIT)
        before = metric_samples(server.base_url)
        offset = len(server.log())
        headers = {"Authorization": f"Bearer {API_KEY}"}

        # HTTP, through the OpenAI SDK: 503 is retryable, with Retry-After
        # (the SDK would retry it: max_retries=0 shows the one refusal).
        client = openai.OpenAI(
            base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0
        )
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="omni-reference", messages=[{"role": "user", "content": "hi"}]
            )
        refused_in = time.monotonic() - started
        assert info.value.status_code == 503
        assert info.value.response.headers["Retry-After"] == "1"
        assert info.value.response.headers["x-should-retry"] == "true"
        assert isinstance(info.value.body, dict)
        _assert_busy(info.value.body)

        # SSE before the first chunk: an ordinary 503.
        stream = httpx.post(
            server.base_url + CHAT,
            json={"messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers=headers,
            timeout=10,
        )
        assert stream.status_code == 503
        assert stream.headers["Retry-After"] == "1"
        assert stream.headers["x-should-retry"] == "true"
        assert stream.headers["content-type"] == "application/json"
        _assert_busy(stream.json()["error"])

        # WebSocket: one error event, straight after response.created.
        before_error = _ws_refused(
            server, headers, {"instructions": "hi"}, _assert_busy
        )
        assert before_error == ["response.created"]

        # A job: accepted, then failed with the stored 503.
        job = httpx.post(
            server.base_url + "/v1/videos",
            json={"prompt": "a fox"},
            headers=headers,
            timeout=10,
        ).json()
        job = _job_until_finished(server, job["id"])
        assert job["status"] == "failed"
        _assert_busy(job["error"])
        assert job["error"]["retryable"] is True  # submitting again can help
        content = httpx.get(
            server.base_url + f"/v1/videos/{job['id']}/content", headers=headers
        )
        assert content.status_code == 503
        _assert_busy(content.json()["error"])
        # Downloading again would read the same stored error.
        assert content.headers["x-should-retry"] == "false"
        assert "retry-after" not in content.headers

        after = metric_samples(server.base_url)
        assert _engine_refusals(before, after) == 4
        by_transport = _503s_by_transport(before, after, ("http", "websocket", "job"))
        # http: SDK, stream, and the failed job's content read back.
        assert by_transport == {"http": 3, "websocket": 1, "job": 1}
        assert after[("vllm_omni:requests_in_flight", ())] == LIMIT
        # Refusals are expected under overload: INFO, no tracebacks.
        lines = server.log()[offset:].splitlines()
        assert not [line for line in lines if "ERROR" in line or "Traceback" in line]
        assert sum("(overload)" in line and " INFO " in line for line in lines) >= 3
        assert sum("(stored job error)" in line for line in lines) == 1
        assert refused_in < 5.0  # at once, not after a queue or a deadline
    finally:
        for sock in holders:
            sock.close()
    # The holders hung up: aborted, capacity is back.
    _wait_in_flight(server, 0)
    reply = httpx.post(
        server.base_url + CHAT,
        json={"messages": [{"role": "user", "content": "hello again"}]},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=30,
    )
    assert reply.status_code == 200


def _head_only(
    server: OmniServer, path: str, length: int, key: str | None = API_KEY
) -> tuple[int, dict[str, str], bytes]:
    """Send a POST's headers (``Content-Length: length``) and hold its body
    back: the server's answer, read with a 10 s timeout."""
    url = urlsplit(server.base_url)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n{auth}"
                f"X-Request-Id: held-body-{path.rsplit('/', 1)[-1]}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {length}\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines)
        while len(body) < int(headers.get("content-length", "0")):
            body += sock.recv(65536)
    return int(status_line.split(" ")[1]), headers, body


ADMITTED_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/audio/speech",
)


def test_refused_before_the_body_is_read(server: OmniServer) -> None:
    """Issue 46: with the engine full, every route that submits work refuses
    before it reads the body (a client holding its body back still hears
    503 at once), with the same record, header, metrics and log line as a
    refusal at admission; the key is still checked first, and the routes
    that submit nothing still answer."""
    holders = [_hold(server, i) for i in range(LIMIT)]
    try:
        _wait_in_flight(server, LIMIT)
        before = metric_samples(server.base_url)
        offset = len(server.log())
        for path in ADMITTED_ROUTES:
            status, headers, body = _head_only(server, path, 4096)
            assert status == 503, (path, body)
            assert headers["retry-after"] == "1"
            assert headers["x-request-id"] == f"held-body-{path.rsplit('/', 1)[-1]}"
            _assert_busy(json.loads(body)["error"])
        # Without the key: 401 first, whatever the load.
        status, _, body = _head_only(server, CHAT, 4096, key=None)
        assert status == 401, body
        # A body that would be a 400 is not read: overload answers first.
        refused = httpx.post(
            server.base_url + CHAT,
            json={"messages": "not a list"},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=10,
        )
        assert refused.status_code == 503
        # Routes that submit nothing are not refused.
        headers = {"Authorization": f"Bearer {API_KEY}"}
        for path in ("/v1/models", "/v1/audio/voices", "/v1/videos"):
            assert httpx.get(server.base_url + path, headers=headers).status_code == 200
        assert httpx.get(server.base_url + "/health").status_code == 200

        after = metric_samples(server.base_url)
        refusals = len(ADMITTED_ROUTES) + 1
        assert _engine_refusals(before, after) == refusals
        assert _503s_by_transport(before, after, ("http",)) == {"http": refusals}
        assert after[("vllm_omni:requests_in_flight", ())] == LIMIT
        lines = server.log()[offset:].splitlines()
        assert not [line for line in lines if "ERROR" in line or "Traceback" in line]
        assert sum("(overload)" in line and " INFO " in line for line in lines) == (
            refusals
        )
    finally:
        for sock in holders:
            sock.close()
    _wait_in_flight(server, 0)


def _assert_talker_busy(error: dict[str, Any]) -> None:
    _assert_busy(error)
    assert error["stage_id"] == TALKER


def test_a_full_stage_refuses_on_every_transport(server: OmniServer) -> None:
    """The talker admits one request: the next one handed to it is refused
    with 503 naming the stage, after the stages before it ran, on HTTP, SSE
    (after the text chunks: an error event) and WebSocket."""
    holder = _hold(
        server,
        0,
        "/v1/audio/speech",
        {"input": "hold @talkhang", "voice": "alloy"},
    )
    try:
        _wait_in_flight(server, 1)
        before = metric_samples(server.base_url)
        offset = len(server.log())
        headers = {"Authorization": f"Bearer {API_KEY}"}
        both = {"modalities": ["text", "audio"]}

        # HTTP, through the OpenAI SDK: the text stage ran, the talker refused.
        client = openai.OpenAI(
            base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0
        )
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="omni-reference",
                messages=[{"role": "user", "content": "hi"}],
                extra_body=both,
            )
        assert info.value.status_code == 503
        assert info.value.response.headers["Retry-After"] == "1"
        assert info.value.response.headers["x-should-retry"] == "true"
        assert isinstance(info.value.body, dict)
        _assert_talker_busy(info.value.body)

        speech = httpx.post(
            server.base_url + "/v1/audio/speech",
            json={"input": "hi", "voice": "alloy"},
            headers=headers,
            timeout=10,
        )
        assert speech.status_code == 503
        assert speech.headers["Retry-After"] == "1"
        assert speech.headers["x-should-retry"] == "true"
        _assert_talker_busy(speech.json()["error"])

        # SSE: the text chunks went out, then one error event and [DONE].
        with httpx.stream(
            "POST",
            server.base_url + CHAT,
            json={
                "messages": [{"role": "user", "content": "hi there"}],
                "stream": True,
                **both,
            },
            headers=headers,
            timeout=10,
        ) as stream:
            assert stream.status_code == 200
            events = [
                line.removeprefix("data: ")
                for line in stream.iter_lines()
                if line.startswith("data: ")
            ]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-2]]
        assert chunks and all("choices" in chunk for chunk in chunks)
        _assert_talker_busy(json.loads(events[-2])["error"])
        assert json.loads(events[-2])["error"]["retryable"] is True

        # WebSocket: after the text deltas, one error event.
        _ws_refused(
            server, headers, {"instructions": "hi", **both}, _assert_talker_busy
        )

        after = metric_samples(server.base_url)
        rejections = {
            stage: sample_delta(
                before,
                after,
                "vllm_omni:admission_rejections_total",
                reason="max_num_queued_reqs",
                stage=stage,
            )
            for stage in ("", str(TALKER))
        }
        assert rejections == {"": 0, str(TALKER): 4}
        by_transport = _503s_by_transport(before, after, ("http", "sse", "websocket"))
        assert by_transport == {"http": 2, "sse": 1, "websocket": 1}
        # A refusal is not an abort anyone asked for.
        assert sample_delta(before, after, "vllm_omni:aborts_total") == 0
        assert after[("vllm_omni:requests_in_flight", ())] == 1
        lines = server.log()[offset:].splitlines()
        assert not [line for line in lines if "ERROR" in line or "Traceback" in line]
        assert sum("(overload)" in line and " INFO " in line for line in lines) == 4
    finally:
        holder.close()
    _wait_in_flight(server, 0)


def test_a_full_video_stage_fails_the_job_with_its_503(server: OmniServer) -> None:
    """The video stage admits one job at a time: the next job is accepted,
    then fails with the stored 503 naming the stage."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    holder = httpx.post(
        server.base_url + "/v1/videos",
        json={"prompt": "hold @vhang"},
        headers=headers,
        timeout=10,
    ).json()
    try:
        _wait_in_flight(server, 1)
        before = metric_samples(server.base_url)
        job = httpx.post(
            server.base_url + "/v1/videos",
            json={"prompt": "a fox"},
            headers=headers,
            timeout=10,
        ).json()
        job = _job_until_finished(server, job["id"])
        assert job["status"] == "failed"
        error = job["error"]
        _assert_busy(error)
        assert error["stage_id"] == VIDEO
        content = httpx.get(
            server.base_url + f"/v1/videos/{job['id']}/content", headers=headers
        )
        assert content.status_code == 503
        # The stored error read back is final: a repeat reads it again.
        assert content.headers["x-should-retry"] == "false"
        assert "retry-after" not in content.headers
        assert error["retryable"] is True
        assert content.json()["error"]["stage_id"] == VIDEO
        after = metric_samples(server.base_url)
        assert (
            sample_delta(
                before,
                after,
                "vllm_omni:admission_rejections_total",
                stage=str(VIDEO),
            )
            == 1
        )
        assert (
            sample_delta(
                before, after, "vllm_omni:errors_total", transport="job", code="503"
            )
            == 1
        )
        assert after[("vllm_omni:requests_in_flight", ())] == 1
    finally:
        httpx.delete(
            server.base_url + f"/v1/videos/{holder['id']}", headers=headers, timeout=10
        )
    _wait_in_flight(server, 0)
