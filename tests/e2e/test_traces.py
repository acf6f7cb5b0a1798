"""Traces end to end (issue 39): a real server exports over OTLP/HTTP to a
real receiver on loopback, which decodes what it gets with
``opentelemetry-proto``; each test sends its own W3C ``traceparent`` and
asserts the exact span tree of that trace and the attributes that matter.

One server for the module (``--max-num-queued-reqs 1``: the tests run one
request at a time, and the overload test fills the engine with one). The
fatal stage failure kills the engine (kept alive by
``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``): it is the module's last test.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.e2e.omni_server import (
    FAULTS,
    LEAK_SECRETS,
    OmniServer,
    write_pipeline,
)
from tests.e2e.servers import metric_samples
from tests.otlp_receiver import (
    Receiver,
    Span,
    TraceParent,
    post_chat,
    receiver,
    start_traced_server,
    tree,
)

CHAT = "/v1/chat/completions"
SERVER_SPAN = f"POST {CHAT}"
GENERIC = "The server had an error while processing your request."
# Spans leave each process within a tenth of a second (the batch's delay);
# an export the collector refuses is retried for 2 s, not 10.
EXPORT_TIMEOUT = {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"}
FATAL_FAULT = {
    "stage": 1,
    "marker": "@dead",
    "action": "raise",
    "exception": "vllm.v1.engine.exceptions:EngineDeadError",
}
# What every record on a span says, and nothing else of it.
RECORD_KEYS = {
    "error.type",
    "vllm_omni.status_code",
    "vllm_omni.category",
    "vllm_omni.fatal",
    "vllm_omni.retryable",
    "vllm_omni.error.message",
    "vllm_omni.request_id",
}


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    yield from receiver()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, collector: Receiver
) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("traces")
    started = start_traced_server(
        directory,
        write_pipeline(directory, faults=[*FAULTS, FATAL_FAULT]),
        collector,
        env={**EXPORT_TIMEOUT, "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
        extra_args=("--max-num-queued-reqs", "1"),
    )
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def client(server: OmniServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0
    )


def _trace(collector: Receiver, parent: TraceParent, count: int) -> list[Span]:
    """The trace's spans once ``count`` of them arrived."""
    return collector.wait_for(parent.trace_id, lambda spans: len(spans) >= count)


def _named(spans: list[Span], name: str) -> Span:
    (span,) = [span for span in spans if span.name == name]
    return span


def _server_span(spans: list[Span], parent: TraceParent) -> Span:
    """The server span: the client's span's only child, a SERVER span."""
    (span,) = [s for s in spans if s.parent_span_id == parent.span_id]
    assert span.kind == "SERVER"
    assert span.resource["vllm_omni.process"] == "engine"
    assert span.resource["service.name"] == "vllm-omni"
    return span


def _assert_record(span: Span, body: dict[str, Any], **expected: Any) -> None:
    """``span`` carries the response's record: the same type, status,
    stage and request id as the body, and ``expected`` besides."""
    error = body["error"]
    attributes = span.attributes
    assert attributes["error.type"] == error["type"]
    assert attributes["vllm_omni.status_code"] == error["code"]
    assert attributes["vllm_omni.error.message"] == error["message"]
    assert attributes.get("vllm_omni.stage_id") == error.get("stage_id")
    assert attributes["vllm_omni.request_id"] == error["request_id"]
    assert attributes.get("vllm_omni.error.param") == error["param"]
    for key, value in expected.items():
        assert attributes[key] == value, key
    server_owned = error["code"] >= 500
    assert attributes["vllm_omni.category"] == ("server" if server_owned else "client")
    assert span.status == ("ERROR" if server_owned else "UNSET")
    assert span.status_message == (error["message"] if server_owned else "")


def _no_record(span: Span) -> None:
    assert not RECORD_KEYS & set(span.attributes) - {"vllm_omni.request_id"}
    assert span.status == "UNSET"


def _in_flight(server: OmniServer) -> float:
    return metric_samples(server.base_url)[("vllm_omni:requests_in_flight", ())]


def _wait_in_flight(server: OmniServer, expected: float) -> None:
    deadline = time.monotonic() + 10
    while _in_flight(server) != expected:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_success_is_one_trace_with_a_span_per_stage(
    server: OmniServer, collector: Receiver, client: openai.OpenAI
) -> None:
    parent = TraceParent()
    raw = client.chat.completions.with_raw_response.create(
        model="omni-reference",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers=parent.headers,
    )
    request_id = raw.headers["x-request-id"]
    spans = _trace(collector, parent, 3)
    assert tree(spans, parent.span_id) == [
        (SERVER_SPAN, [("stage guardrail", []), ("stage thinker", [])])
    ]
    root = _server_span(spans, parent)
    assert root.attributes == {
        "http.request.method": "POST",
        "http.route": CHAT,
        "url.path": CHAT,
        "url.scheme": "http",
        "http.response.status_code": 200,
        "vllm_omni.request_id": request_id,
    }
    assert root.status == "UNSET"
    for stage_id, name, kind, process in (
        (0, "guardrail", "guardrail", "engine"),  # in the server's process
        (1, "thinker", "text", "stage-1"),  # in its stage process
    ):
        span = _named(spans, f"stage {name}")
        assert span.attributes == {
            "vllm_omni.stage_id": stage_id,
            "vllm_omni.stage.name": name,
            "vllm_omni.stage.kind": kind,
            "vllm_omni.request_id": request_id,
        }
        assert span.resource["vllm_omni.process"] == process
        assert span.status == "UNSET"


def test_a_client_error_in_a_stage_is_recorded_but_not_an_error(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    response = post_chat(server, "tell me about forbidden-topic", parent)
    assert response.status_code == 400
    spans = _trace(collector, parent, 2)
    assert tree(spans, parent.span_id) == [(SERVER_SPAN, [("stage guardrail", [])])]
    root = _server_span(spans, parent)
    assert root.attributes["http.response.status_code"] == 400
    body = response.json()
    _assert_record(root, body, **{"vllm_omni.retryable": False})
    _assert_record(_named(spans, "stage guardrail"), body)
    assert body["error"]["type"] == "GuardrailViolationError"


def test_a_rejected_field_names_its_param_on_the_stage_span(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    response = httpx.post(
        server.base_url + CHAT,
        json={"messages": [{"role": "user", "content": "hi"}], "temperature": 9},
        headers=parent.headers,
        timeout=30,
    )
    assert response.status_code == 400
    spans = _trace(collector, parent, 3)
    assert tree(spans, parent.span_id) == [
        (SERVER_SPAN, [("stage guardrail", []), ("stage thinker", [])])
    ]
    body = response.json()
    param = {"vllm_omni.error.param": "temperature", "vllm_omni.stage_id": 1}
    _assert_record(_server_span(spans, parent), body, **param)
    _assert_record(_named(spans, "stage thinker"), body, **param)


def test_a_nonfatal_stage_failure_is_on_the_stage_span_and_the_server_span(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    response = post_chat(server, "@boom", parent)
    assert response.status_code == 500
    body = response.json()
    assert body["error"]["stage_id"] == 1
    spans = _trace(collector, parent, 3)
    assert tree(spans, parent.span_id) == [
        (SERVER_SPAN, [("stage guardrail", []), ("stage thinker", [])])
    ]
    root = _server_span(spans, parent)
    assert root.attributes["http.response.status_code"] == 500
    for span in (root, _named(spans, "stage thinker")):
        _assert_record(
            span,
            body,
            **{"vllm_omni.fatal": False, "vllm_omni.retryable": True},
        )
        assert span.status_message == GENERIC
    _no_record(_named(spans, "stage guardrail"))


def test_a_deadline_504_and_an_overload_503_look_distinct(
    server: OmniServer, collector: Receiver
) -> None:
    held, refused = TraceParent(), TraceParent()
    answers: dict[str, httpx.Response] = {}
    # The thinker hangs past its 3 s deadline, holding the engine's one slot.
    holder = threading.Thread(
        target=lambda: answers.setdefault("held", post_chat(server, "@hang", held))
    )
    holder.start()
    _wait_in_flight(server, 1)
    overload = post_chat(server, "hello", refused)
    holder.join()
    assert overload.status_code == 503
    timeout = answers["held"]
    assert timeout.status_code == 504

    # Refused at admission: no stage saw it.
    spans = _trace(collector, refused, 1)
    assert tree(spans, refused.span_id) == [(SERVER_SPAN, [])]
    root = _server_span(spans, refused)
    assert root.attributes["http.response.status_code"] == 503
    _assert_record(root, overload.json(), **{"vllm_omni.retryable": True})
    assert "vllm_omni.stage_id" not in root.attributes

    # The deadline: the thinker's work was aborted, not failed; the 504 with
    # the stage's id is the server span's.
    spans = _trace(collector, held, 3)
    assert tree(spans, held.span_id) == [
        (SERVER_SPAN, [("stage guardrail", []), ("stage thinker", [])])
    ]
    root = _server_span(spans, held)
    assert root.attributes["http.response.status_code"] == 504
    body = timeout.json()
    assert body["error"]["type"] == "GatewayTimeoutError"
    _assert_record(root, body, **{"vllm_omni.stage_id": 1, "vllm_omni.retryable": True})
    thinker = _named(spans, "stage thinker")
    assert thinker.attributes["vllm_omni.aborted"] is True
    _no_record(thinker)


def test_a_streamed_failure_after_the_first_chunk(
    server: OmniServer, collector: Receiver, client: openai.OpenAI
) -> None:
    parent = TraceParent()
    stream = client.chat.completions.create(
        model="omni-reference",
        messages=[{"role": "user", "content": "talk then @talkboom"}],
        modalities=["text", "audio"],
        stream=True,
        extra_headers=parent.headers,
    )
    chunks = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            chunks.append(chunk)
    assert chunks, "the stream must have started before the fault"
    spans = _trace(collector, parent, 4)
    assert tree(spans, parent.span_id) == [
        (
            SERVER_SPAN,
            [("stage guardrail", []), ("stage talker", []), ("stage thinker", [])],
        )
    ]
    root = _server_span(spans, parent)
    # The status went out before the failure; the record is the event's.
    assert root.attributes["http.response.status_code"] == 200
    body = {"error": caught.value.body}
    assert body["error"]["stage_id"] == 2
    _assert_record(root, body)
    _assert_record(_named(spans, "stage talker"), body)
    _no_record(_named(spans, "stage thinker"))


def test_a_client_that_hangs_up_is_a_499_abort_not_an_error(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    url = urlsplit(server.base_url)
    body = json.dumps({"messages": [{"role": "user", "content": "wait @hang"}]})
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(
            (
                f"POST {CHAT} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"traceparent: {parent.headers['traceparent']}\r\n"
                f"Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        _wait_in_flight(server, 1)
    _wait_in_flight(server, 0)
    spans = _trace(collector, parent, 3)
    assert tree(spans, parent.span_id) == [
        (SERVER_SPAN, [("stage guardrail", []), ("stage thinker", [])])
    ]
    root = _server_span(spans, parent)
    assert root.attributes["http.response.status_code"] == 499
    assert root.attributes["vllm_omni.abort_reason"] == "client_disconnect"
    _no_record(root)
    assert _named(spans, "stage thinker").attributes["vllm_omni.aborted"] is True


def test_a_websocket_session_is_one_trace_of_its_responses(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    url = server.base_url.replace("http://", "ws://", 1) + "/v1/realtime"
    with ws_connect(url, additional_headers=parent.headers) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        for prompt in ("hello realtime", "explode @boom"):
            ws.send(
                json.dumps(
                    {"type": "response.create", "response": {"instructions": prompt}}
                )
            )
            while (event := json.loads(ws.recv(timeout=10)))["type"] not in (
                "response.done",
                "error",
            ):
                pass
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    spans = _trace(collector, parent, 5)
    session = "WEBSOCKET /v1/realtime"
    stages = [("stage guardrail", []), ("stage thinker", [])]
    assert tree(spans, parent.span_id) == [(session, sorted(stages * 2))]
    root = _server_span(spans, parent)
    assert "http.response.status_code" not in root.attributes  # accepted
    assert root.attributes["http.request.method"] == "GET"  # the handshake
    _assert_record(root, {"error": event["error"]})
    thinkers = [s for s in spans if s.name == "stage thinker"]
    assert sorted(s.status for s in thinkers) == ["ERROR", "UNSET"]


def test_an_async_job_run_is_a_child_of_the_request_that_created_it(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    created = httpx.post(
        server.base_url + "/v1/videos",
        json={"prompt": "a clip @vleak", "seconds": "0.2", "size": "64x64"},
        headers=parent.headers,
        timeout=30,
    )
    assert created.status_code == 200
    job = created.json()["id"]
    deadline = time.monotonic() + 30
    while (read := httpx.get(f"{server.base_url}/v1/videos/{job}").json())[
        "status"
    ] != "failed":
        assert time.monotonic() < deadline, read
        time.sleep(0.1)
    spans = _trace(collector, parent, 4)
    assert tree(spans, parent.span_id) == [
        (
            "POST /v1/videos",
            [("video job", [("stage guardrail", []), ("stage video", [])])],
        )
    ]
    stored = {"error": read["error"]}
    _assert_record(_named(spans, "video job"), stored)
    _assert_record(_named(spans, "stage video"), stored)
    # The failure's text carried credentials, paths and media: the spans
    # carry the public record's text only.
    said = repr([(s.attributes, s.status_message) for s in spans])
    assert not [secret for secret in LEAK_SECRETS if secret in said]


def test_a_collector_that_refuses_costs_nothing_and_is_logged_once(
    server: OmniServer, collector: Receiver
) -> None:
    failed = r"trace export to \S+ failed"
    collector.refusing = True
    try:
        for _ in range(3):
            assert post_chat(server, "hello", TraceParent()).status_code == 200
        # The server's process (its span, the guardrail's) and the
        # thinker's stage process each lose their spans.
        server.wait_for_log(
            f"vllm_omni.tracing: {failed}", f"stage-1.*{failed}", within_s=30
        )
        assert post_chat(server, "hello", TraceParent()).status_code == 200
    finally:
        collector.refusing = False
    assert post_chat(server, "hello", TraceParent()).status_code == 200
    server.wait_for_log(
        "vllm_omni.tracing: trace export to .* answers again",
        "stage-1.*trace export to .* answers again",
        within_s=30,
    )
    lines = [line for line in server.log().splitlines() if "trace export to" in line]
    assert len([line for line in lines if re.search(failed, line)]) == 2, lines
    assert not [line for line in server.log().splitlines() if "Queue full" in line]


def test_a_fatal_stage_failure_is_on_the_dead_stage_span(
    server: OmniServer, collector: Receiver
) -> None:
    """Last: the engine is dead afterwards."""
    parent = TraceParent()
    response = post_chat(server, "@dead", parent)
    assert response.status_code == 500
    body = response.json()
    assert body["error"]["stage_id"] == 1
    spans = _trace(collector, parent, 3)
    assert tree(spans, parent.span_id) == [
        (SERVER_SPAN, [("stage guardrail", []), ("stage thinker", [])])
    ]
    fatal = {"vllm_omni.fatal": True, "vllm_omni.retryable": False}
    _assert_record(_server_span(spans, parent), body, **fatal)
    # Sent by the stage process before it exited.
    _assert_record(_named(spans, "stage thinker"), body, **fatal)
