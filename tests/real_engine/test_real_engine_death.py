"""SIGKILL of the real EngineCore process while a stream and a plain request
are in flight: the stream ends with one terminal error event, the plain
request is a 500 naming the vllm stage, and the server exits 1 — unless
``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` keeps it up with ``/health`` 503.

Before the kill, both servers (LoRA off) answer a LoRA request with a 400,
and a client that hangs up mid-stream has its request aborted in the engine.

The engine's metrics of the dead stage (issue 27): its gauges leave
``/metrics``, its counters stay, and the requests the death failed are no
finished request of any reason (as in ``vllm serve``). Neither server
leaves its stages' multiprocess files behind once it exited.

These servers allow ``LONG_MODEL_LEN`` tokens: a response of tens of
thousands of tokens takes the tiny model over a minute, far longer than any
client needs to act on its first chunk (at 112 tokens the whole stream could
be generated before the first chunk reached the client, and the kill or
hang-up landed after the end). The drills also stop the model's worker
once the engine has the request (``tests/real_engine/pause.py``): on 2
cores the spinning engine holds back every other process, and a CI run saw
the first chunk only when a 4,000-token response was already complete.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.omni_server import OmniServer, start_server
from tests.prom import value
from tests.real_engine.conftest import (
    running_servers,
    write_tiny_pipeline,
)
from tests.real_engine.engine_metrics import (
    engine_families,
    engine_gauges,
    metrics_text,
    success_by_reason,
)
from tests.real_engine.pause import EnginePause, Stream, warm_up
from tests.real_engine.tiny_model import LONG_MODEL_LEN

pytestmark = pytest.mark.timeout(600)

GENERIC = "The server had an error while processing your request."
CHAT = "/v1/chat/completions"
STAGE_ID = 1
# Every drill's response is this long: ``ignore_eos``, since greedy decoding
# of the random model may pick its EOS early on another CPU's kernels (a
# stream that ends by itself before the kill tests nothing).
LONG = {"max_tokens": LONG_MODEL_LEN - 64, "ignore_eos": True}


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[dict[str, OmniServer]]:
    root = tmp_path_factory.mktemp("real-death")

    def pipeline(directory: Path) -> Path:
        return write_tiny_pipeline(
            directory,
            tiny_model,
            max_model_len=LONG_MODEL_LEN,
            enable_log_requests=True,
        )

    def temp(name: str) -> dict[str, str]:
        """A temp directory of the server's own (TMPDIR), to look for leftovers."""
        (root / name / "tmp").mkdir(parents=True)
        return {"TMPDIR": str(root / name / "tmp")}

    # One after the other: two engines starting at once on 2 cores can pass
    # the orchestrator's 120 s startup limit when the machine is busy.
    with (
        running_servers(
            {
                "exits": start_server(
                    root / "exits", pipeline(root / "exits"), env=temp("exits")
                )
            }
        ) as exits,
        running_servers(
            {
                "alive": start_server(
                    root / "alive",
                    pipeline(root / "alive"),
                    env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1", **temp("alive")},
                )
            }
        ) as alive,
    ):
        yield {**exits, **alive}


def metrics_dirs(server: OmniServer) -> list[Path]:
    """The stages' multiprocess directories in the server's TMPDIR."""
    return list((server.log_path.parent / "tmp").glob("vllm-omni-metrics-*"))


def _plain(base: str, sink: dict[str, Any]) -> None:
    sink["response"] = httpx.post(
        base + CHAT,
        json={"messages": [{"role": "user", "content": "hello"}], **LONG},
        timeout=60,
    )


def kill_engine_during_stream(server: OmniServer) -> tuple[list[str], httpx.Response]:
    """SIGKILL the EngineCore after the stream's first chunk (held stopped at
    that chunk, then killed with a plain request in flight too); the stream's
    data events and the plain request's response."""
    plain: dict[str, Any] = {}
    waiter = threading.Thread(target=_plain, args=(server.base_url, plain))
    stream = Stream(
        server.base_url + CHAT,
        {
            "messages": [{"role": "user", "content": "hello world"}],
            "stream": True,
            **LONG,
        },
    )
    warm_up(server)
    with EnginePause(server) as pause:
        stream.start()
        pause.until(server, stream)  # the engine is now stopped, mid-stream
        assert (stream.status, stream.error, stream.is_alive()) == (200, None, True)
        waiter.start()
        time.sleep(0.5)  # the plain request reaches the stopped engine
        # Still mid-stream (what it got, if not).
        assert stream.is_alive(), (stream.error, stream.events[-3:])
        os.kill(pause.pid, signal.SIGKILL)
        pause.resume()  # the worker notices its EngineCore is gone
        stream.join(timeout=60)
    waiter.join(timeout=60)
    assert stream.error is None
    return stream.events, plain["response"]


def assert_terminal_error(events: list[str]) -> None:
    assert events[-1] == "[DONE]"
    errors = [json.loads(e)["error"] for e in events[:-1] if e.startswith('{"error"')]
    assert len(errors) == 1 and events[-2].startswith('{"error"'), (
        len(events),
        events[-3:],
    )
    (error,) = errors
    assert (error["code"], error["type"], error["message"], error["stage_id"]) == (
        500,
        "InternalServerError",
        GENERIC,
        STAGE_ID,
    )


def assert_stage_500(response: httpx.Response) -> None:
    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["message"], error["stage_id"]) == (GENERIC, STAGE_ID)


@pytest.mark.parametrize("name", ["exits", "alive"])
def test_a_lora_request_without_lora_enabled_is_a_400(
    servers: dict[str, OmniServer], name: str
) -> None:
    client = openai.OpenAI(
        base_url=servers[name].base_url + "/v1", api_key="-", max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-qwen2",
            messages=[{"role": "user", "content": "hello"}],
            extra_body={"lora": "some-adapter"},
        )
    error = info.value.response.json()["error"]
    assert (error["code"], error["param"], error["stage_id"]) == (400, "lora", STAGE_ID)
    assert "some-adapter" not in error["message"]


def test_client_disconnect_aborts_the_request_in_the_engine(
    servers: dict[str, OmniServer],
) -> None:
    server = servers["exits"]
    body = {
        "model": "tiny-qwen2",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        **LONG,
    }
    # The model is held at the first chunk, so the hang-up lands mid-stream
    # (the response has thousands of tokens to go).
    stream = Stream(server.base_url + CHAT, body, hang_up=True)
    warm_up(server)
    with EnginePause(server) as pause:
        stream.start()
        pause.until(server, stream)
        stream.join(timeout=30)
        assert (stream.status, stream.error) == (200, None)
        completion_id = json.loads(stream.events[0])["id"]
        request_id = completion_id.removeprefix("chatcmpl-")
        # The abort reaches the vllm stage while the model is still stopped.
        server.wait_for_log(
            rf"stage 1: request {re.escape(request_id)} aborted", within_s=60
        )
    # AsyncLLM (enable_log_requests) logs the abort it received; it may
    # need the engine to move (under load it did not while held).
    server.wait_for_log(rf"Request \S*{re.escape(request_id)}\S* aborted", within_s=60)


def test_sigkill_of_the_engine_core_fails_in_flight_and_exits_1(
    servers: dict[str, OmniServer],
) -> None:
    server = servers["exits"]
    events, plain = kill_engine_during_stream(server)
    assert_terminal_error(events)
    assert_stage_500(plain)
    assert server.proc.wait(timeout=30) == 1
    assert "engine dead: stage 1" in server.log()
    assert metrics_dirs(server) == []


def test_keep_alive_serves_503_health_and_500s(
    servers: dict[str, OmniServer],
) -> None:
    server = servers["alive"]
    before = metrics_text(server)
    assert engine_gauges(before)  # the stage's, while it runs
    (directory,) = metrics_dirs(server)
    assert list(directory.glob("stage-1/*.db"))
    events, plain = kill_engine_during_stream(server)
    assert_terminal_error(events)
    assert_stage_500(plain)
    after = _once_gauges_left(server)
    # The warm-up stream finished; the two the death failed did not.
    assert sum(success_by_reason(after).values()) == (
        sum(success_by_reason(before).values()) + 1
    )
    success = engine_families(after)["vllm:request_success"]
    assert {s.labels["stage"] for s in success.samples} == {"1"}
    assert value(after, "vllm_omni:engine_dead") == 1
    health = httpx.get(server.base_url + "/health", timeout=5)
    assert health.status_code == 503
    assert health.json()["error"]["code"] == 503
    after = httpx.post(
        server.base_url + CHAT,
        json={"messages": [{"role": "user", "content": "anyone?"}]},
        timeout=30,
    )
    assert after.status_code == 500
    assert after.json()["error"]["message"] == GENERIC
    time.sleep(1)
    assert server.proc.poll() is None


def _once_gauges_left(server: OmniServer) -> str:
    """``/metrics`` once the dead stage's gauges left it (the launcher reports
    the stage's exit a moment after the engine is marked dead)."""
    deadline = time.monotonic() + 10
    while engine_gauges(text := metrics_text(server)):
        assert time.monotonic() < deadline, engine_gauges(text)
        time.sleep(0.1)
    return text


def test_no_metrics_files_are_left_once_the_servers_stopped(
    servers: dict[str, OmniServer],
) -> None:
    for server in servers.values():
        server.stop()
        assert server.proc.returncode is not None
        assert metrics_dirs(server) == []
