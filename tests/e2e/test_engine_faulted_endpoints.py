"""vLLM 0.34's ``EngineFaultedError`` raised in a stage process reaches every
transport as the status table says: 503 ``ServiceUnavailableError`` with the
stage id, ``x-should-retry: true`` and ``Retry-After`` over HTTP (through the
OpenAI SDK), SSE before the first chunk, a WebSocket error event (close 1013)
and a failed job's stored error; counted in
``vllm_omni:engine_faulted_refusals_total{stage}``; logged at INFO without a
traceback. Skipped where the installed vLLM does not define the class."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import vllm.exceptions
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.e2e.omni_server import FAULTS, OmniServer, start_server, write_pipeline
from tests.e2e.servers import metric_samples, sample_delta

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not hasattr(vllm.exceptions, "EngineFaultedError"),
        reason="the installed vLLM has no EngineFaultedError (0.34+)",
    ),
]

API_KEY = "faulted-key-0123456789"
TEXT = 1
VIDEO = 5
FAULTED = (
    "The engine has faulted and cannot accept new requests. "
    "Please try again later or on a different instance."
)
RAISE = {"action": "raise", "exception": "vllm.exceptions:EngineFaultedError"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("faulted")
    faults = [
        *FAULTS,
        {"stage": TEXT, "marker": "@faulted", **RAISE},
        {"stage": VIDEO, "marker": "@vfaulted", **RAISE},
    ]
    started = start_server(
        directory, write_pipeline(directory, faults=faults), api_key=API_KEY
    )
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def _assert_faulted(error: dict[str, Any], stage: int) -> None:
    assert {k: error[k] for k in ("message", "type", "param", "code")} == {
        "message": FAULTED,
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
    assert error["stage_id"] == stage


def test_a_faulted_stage_refusal_on_every_transport(server: OmniServer) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    before = metric_samples(server.base_url)
    offset = len(server.log())
    chat = [{"role": "user", "content": "hi @faulted"}]

    client = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0
    )
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="omni-reference", messages=chat)  # type: ignore[arg-type]
    assert info.value.status_code == 503
    assert info.value.response.headers["x-should-retry"] == "true"
    assert info.value.response.headers["Retry-After"] == "1"
    assert isinstance(info.value.body, dict)
    _assert_faulted(info.value.body, TEXT)

    # SSE before the first chunk: an ordinary 503.
    stream = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": chat, "stream": True},
        headers=headers,
        timeout=30,
    )
    assert stream.status_code == 503
    assert stream.headers["x-should-retry"] == "true"
    _assert_faulted(stream.json()["error"], TEXT)

    # WebSocket: one error event, retryable, then "try again later".
    ws_url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    with connect(ws_url, additional_headers=headers) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "event_id": "e1",
                    "response": {"instructions": "hi @faulted"},
                }
            )
        )
        event = json.loads(ws.recv(timeout=30))
        while event["type"] != "error":
            event = json.loads(ws.recv(timeout=30))
        _assert_faulted(event["error"], TEXT)
        assert event["error"]["retryable"] is True
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013

    # A job: accepted, then failed with the stored 503 of the video stage.
    job = httpx.post(
        server.base_url + "/v1/videos",
        json={"prompt": "a fox @vfaulted"},
        headers=headers,
        timeout=10,
    ).json()
    deadline = time.monotonic() + 30
    while job["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
        job = httpx.get(
            server.base_url + f"/v1/videos/{job['id']}", headers=headers
        ).json()
    assert job["status"] == "failed"
    _assert_faulted(job["error"], VIDEO)
    assert job["error"]["retryable"] is True

    after = metric_samples(server.base_url)
    refusals = {
        stage: sample_delta(
            before, after, "vllm_omni:engine_faulted_refusals_total", stage=stage
        )
        for stage in (str(TEXT), str(VIDEO))
    }
    assert refusals == {str(TEXT): 3, str(VIDEO): 1}
    assert (
        sample_delta(
            before,
            after,
            "vllm_omni:errors_total",
            code="503",
            type="ServiceUnavailableError",
        )
        == 4
    )
    # A refusal while the engine recovers is expected: INFO, no traceback.
    lines = server.log()[offset:].splitlines()
    faulted = [line for line in lines if "(engine faulted)" in line]
    assert len(faulted) >= 3 and all(" INFO " in line for line in faulted)
    assert not [line for line in lines if "Traceback" in line or "ERROR" in line]

    # The stage still serves what does not fault.
    reply = client.chat.completions.create(
        model="omni-reference", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content
