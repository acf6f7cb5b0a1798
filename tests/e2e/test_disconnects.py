"""A client that hangs up before its response started (§9): the request is
aborted in every stage within 1 s, logged once at INFO, counted in
``vllm_omni:aborts_total{reason="client_disconnect"}``, and is neither an
error (``errors_total``) nor a 5xx (``http_requests_total``) — on every
route, streaming or not, uploads included.

Each hanging prompt would otherwise run until its stage deadline (text 3 s,
talker 10 s) and be logged at ERROR and counted as a 504.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.omni_server import OmniServer
from tests.e2e.servers import metric_samples, sample_delta, settled_samples

pytestmark = pytest.mark.timeout(240)

ALL_STAGES = range(6)
DISCONNECTED = "client disconnected before the response started"
_ids = itertools.count()


def _rid(name: str) -> str:
    return f"hangup-{name}-{next(_ids)}"


def _hang_up(server: OmniServer, path: str, body: dict[str, Any], rid: str) -> None:
    """Send, wait 0.5 s for a response that does not come, close the socket."""
    headers = {**server.headers(), "X-Request-Id": rid}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + path,
            json=body,
            headers=headers,
            timeout=httpx.Timeout(10.0, read=0.5),
        )


def _cut_upload(server: OmniServer, path: str, content_type: str, rid: str) -> None:
    """Announce a large body, send a little of it, close the socket."""
    url = urlsplit(server.base_url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {server.api_key}\r\nX-Request-Id: {rid}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: 100000\r\n\r\n"
    )
    part = (
        b'--XX\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na fox\r\n'
        if content_type.startswith("multipart")
        else b'{"messages": [{"role": "user", "content": "'
    )
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head.encode() + part)
        time.sleep(0.3)


def _log_lines_after(server: OmniServer, offset: int) -> list[str]:
    return server.log()[offset:].splitlines()


def _assert_disconnect_outcome(
    server: OmniServer,
    *,
    handler: str,
    rid: str,
    hung_up: Callable[[], None],
    stages: range | tuple[int, ...],
) -> None:
    before = metric_samples(server.base_url)
    offset = len(server.log())
    hung_up()
    gone = time.monotonic()
    # The abort reaches every stage within 1 s of the hang-up.
    while stages:
        lines = _log_lines_after(server, offset)
        missing = [
            s
            for s in stages
            if not any(f"stage {s}: request {rid} aborted" in line for line in lines)
        ]
        if not missing:
            break
        assert time.monotonic() - gone < 1.0, f"stages {missing} did not abort"
        time.sleep(0.02)
    after = settled_samples(
        server.base_url,
        before,
        "vllm_omni:aborts_total",
        1,
        reason="client_disconnect",
    )
    assert (
        sample_delta(
            before, after, "vllm_omni:aborts_total", reason="client_disconnect"
        )
        == 1
    )
    # 499 (nobody receives it): a 4xx in the request counter, never a 5xx.
    assert sample_delta(before, after, "http_requests_total", handler=handler) == 1
    statuses = {
        status: sample_delta(
            before, after, "http_requests_total", handler=handler, status=status
        )
        for status in ("2xx", "4xx", "5xx")
    }
    assert statuses == {"2xx": 0, "4xx": 1, "5xx": 0}
    assert sample_delta(before, after, "vllm_omni:errors_total") == 0
    # Past every stage deadline that could have fired, the log is clean.
    time.sleep(0.5)
    lines = _log_lines_after(server, offset)
    mentions = [line for line in lines if rid in line]
    assert [line for line in mentions if DISCONNECTED in line] == [
        line for line in mentions if " INFO " in line and DISCONNECTED in line
    ]
    assert sum(DISCONNECTED in line for line in mentions) == 1
    assert not [line for line in lines if "ERROR" in line or "Traceback" in line]
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_plain_chat(omni_server: OmniServer) -> None:
    rid = _rid("chat")
    body = {"messages": [{"role": "user", "content": "wait @hang"}]}
    _assert_disconnect_outcome(
        omni_server,
        handler="/v1/chat/completions",
        rid=rid,
        hung_up=lambda: _hang_up(omni_server, "/v1/chat/completions", body, rid),
        stages=ALL_STAGES,
    )


def test_stream_before_its_first_chunk(omni_server: OmniServer) -> None:
    rid = _rid("stream")
    body = {"messages": [{"role": "user", "content": "wait @hang"}], "stream": True}
    _assert_disconnect_outcome(
        omni_server,
        handler="/v1/chat/completions",
        rid=rid,
        hung_up=lambda: _hang_up(omni_server, "/v1/chat/completions", body, rid),
        stages=ALL_STAGES,
    )


def test_speech(omni_server: OmniServer) -> None:
    rid = _rid("speech")
    body = {"input": "say it @talkhang", "voice": "alloy"}
    _assert_disconnect_outcome(
        omni_server,
        handler="/v1/audio/speech",
        rid=rid,
        hung_up=lambda: _hang_up(omni_server, "/v1/audio/speech", body, rid),
        stages=ALL_STAGES,
    )


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/videos", "multipart/form-data; boundary=XX"),
        ("/v1/chat/completions", "application/json"),
        ("/v1/images/generations", "application/json"),
    ],
    ids=["videos-multipart", "chat-json", "images-json"],
)
def test_upload_cut_mid_body(
    omni_server: OmniServer, path: str, content_type: str
) -> None:
    rid = _rid("upload")
    _assert_disconnect_outcome(
        omni_server,
        handler=path,
        rid=rid,
        hung_up=lambda: _cut_upload(omni_server, path, content_type, rid),
        stages=(),  # never reached the engine
    )
