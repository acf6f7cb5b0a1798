"""The fault-tolerance drill: a stage's engine faults and recovers under load.

A real ``vllm-omni serve`` whose stage 1 is a ``vllm`` stage in a stage
process of its own (``remote: true``, started here as
``tests.engine.fault_tolerant_stage``) over the stand-in of vLLM 0.34's
fault-tolerant engine (``tests/engine/fault_tolerant_llm.py``: the statuses,
transitions and recovery interface of 0.34's client; the real one needs
external-LB data parallelism on GPUs). Its status travels with its
heartbeats, its recovery over the stage wire.

Clients (the OpenAI SDK, raw SSE) send requests before, during and after
the fault, and one loop sends them all along. Every request ends: a 200 with
the whole reply, or a 503 naming stage 1 with ``x-should-retry: true``;
never a 200 with a truncated reply. While the stage is faulted, ``/health``
answers 503 naming it, new requests are refused with the faulted 503 and a
``Retry-After`` (counted in ``vllm_omni:engine_faulted_refusals_total``),
a stream held there ends with a retryable error event, and
``vllm_omni:stage_status`` says so; the server drives the recovery (one
``retry``, with a request id), ``/v1/fault_tolerance/*`` show and refuse in
the canonical envelope, and the recovery is counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import vllm.exceptions
import yaml

from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.servers import free_port, metric_samples, sample_delta
from tests.engine.fault_tolerant_llm import REPLY, EngineFaultedError

pytestmark = pytest.mark.timeout(300)

STAGE = 1
MODEL = "omni-fault-drill"
WHOLE = "".join(REPLY)
RECOVERY_S = 5.0
WINDOW_S = 60
FAULTED = "Stage 1 (thinker) has faulted and cannot accept new requests."
ENGINE_REFUSAL = str(EngineFaultedError())
ENGINE_REFUSAL_TYPE = (
    "ServiceUnavailableError"
    if hasattr(vllm.exceptions, "EngineFaultedError")
    else "Service Unavailable"
)


@dataclass
class Drill:
    server: OmniServer
    stage: subprocess.Popen[bytes]
    stage_log: Path
    client: openai.OpenAI = field(init=False)

    def __post_init__(self) -> None:
        self.client = openai.OpenAI(
            base_url=self.server.base_url + "/v1", api_key="none", max_retries=0
        )


# With two API server processes (issue 46) the drill runs with the drills
# (``-m drill``, .ci/run), not in the main suite.
@pytest.fixture(
    scope="module",
    params=[1, pytest.param(2, marks=pytest.mark.drill)],
    ids=["one-api-server", "two-api-servers"],
)
def drill(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Drill]:
    directory = tmp_path_factory.mktemp("fault-drill")
    address = f"tcp://127.0.0.1:{free_port()}"
    path = directory / "pipeline.yaml"
    engine_args = {
        "model": "stand-in",
        "recovery_s": RECOVERY_S,
        "diagnose_s": 0.2,
        "window_s": WINDOW_S,
    }
    path.write_text(
        yaml.safe_dump(
            {
                "model": MODEL,
                "orchestrator_address": address,
                "stages": [
                    {"id": 0, "name": "guardrail", "kind": "guardrail"},
                    {
                        "id": STAGE,
                        "name": "thinker",
                        "kind": "vllm",
                        "remote": True,
                        "timeout_s": 30,
                        "options": {"engine_args": engine_args},
                    },
                ],
                "guardrail": {"blocklist": ["forbidden-topic"]},
            }
        )
    )
    server = start_server(
        directory, path, extra_args=("--api-server-count", str(request.param))
    )
    stage_log = directory / "stage.log"
    stage = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.engine.fault_tolerant_stage",
            "--connect",
            address,
            "--pipeline",
            str(path),
            "--stage-id",
            str(STAGE),
        ],
        stdout=stage_log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        server.wait_ready(timeout=240)
        yield Drill(server, stage, stage_log)
    finally:
        server.stop()
        # It would exit by itself once its orchestrator's heartbeats stop
        # (seconds); nothing waits for that here.
        stage.terminate()
        try:
            stage.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stage.kill()
            stage.wait(timeout=10)


@dataclass
class Outcome:
    """One request's end: its status, its reply or its error."""

    status: int
    text: str | None = None
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _chat(drill: Drill, prompt: str) -> Outcome:
    try:
        reply = drill.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}]
        )
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return Outcome(exc.status_code, error=body, headers=dict(exc.response.headers))
    return Outcome(200, text=reply.choices[0].message.content)


def _assert_terminal(outcome: Outcome) -> None:
    """A whole reply, or a retryable 503 naming the stage: nothing else."""
    if outcome.status == 200:
        assert outcome.text == WHOLE, outcome
        return
    assert outcome.status == 503, outcome
    assert outcome.error is not None and outcome.error["stage_id"] == STAGE
    if outcome.error["message"] == ENGINE_REFUSAL:
        # The engine refused before its status reached the server (a request
        # sent between the fault and the next heartbeat): upstream's class,
        # typed as the installed vLLM types it (0.33 has no EngineFaultedError:
        # the stand-in's is a plain GracefulHTTPError, typed by its phrase).
        assert outcome.error["type"] == ENGINE_REFUSAL_TYPE
    else:
        assert outcome.error["type"] == "ServiceUnavailableError"
    assert outcome.headers["x-should-retry"] == "true"


def _health(drill: Drill) -> httpx.Response:
    return httpx.get(drill.server.base_url + "/health", timeout=5)


def _until(predicate: Any, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _status(drill: Drill) -> dict[int, dict[str, Any]]:
    response = httpx.get(
        drill.server.base_url + "/v1/fault_tolerance/status", timeout=5
    )
    assert response.status_code == 200
    return {stage["stage_id"]: stage for stage in response.json()["stages"]}


def _stage_status(samples: dict[Any, float]) -> str:
    current = [
        dict(labels)["status"]
        for (name, labels), value in samples.items()
        if name == "vllm_omni:stage_status"
        and dict(labels)["stage"] == str(STAGE)
        and value == 1
    ]
    assert len(current) == 1, current
    return current[0]


def _held_stream(drill: Drill, events: list[dict[str, Any]]) -> None:
    """A streamed request the engine holds until it faults: its events."""
    with httpx.stream(
        "POST",
        drill.server.base_url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "stream": True,
            "messages": [{"role": "user", "content": "wait @hang"}],
        },
        timeout=60,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append({"done": True} if data == "[DONE]" else json.loads(data))


def test_a_stage_faults_and_recovers_under_load(drill: Drill) -> None:
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            outcomes.append(_chat(drill, "steady"))
            time.sleep(0.05)

    # Before: served, healthy everywhere.
    before = [_chat(drill, "before") for _ in range(3)]
    assert [o.status for o in before] == [200, 200, 200]
    _until(lambda: _status(drill)[STAGE]["fault_tolerance"])
    assert _health(drill).status_code == 200
    start = metric_samples(drill.server.base_url)
    assert _stage_status(start) == "healthy"
    assert start[
        ("vllm_omni:stage_recovery_window_seconds", (("stage", str(STAGE)),))
    ] == float(WINDOW_S)
    status = _status(drill)
    assert status[STAGE]["engines"] == [{"id": 0, "status": "healthy"}]
    assert status[0] == {
        "stage_id": 0,
        "name": "guardrail",
        "status": "healthy",
        "fault_tolerance": False,
    }

    loader = threading.Thread(target=load)
    loader.start()
    events: list[dict[str, Any]] = []
    held = threading.Thread(target=_held_stream, args=(drill, events))
    held.start()
    _until(lambda: len(events) >= 1)  # the engine holds it: its first chunk is out

    # The fault: the request that hit it fails like every one held there.
    trigger = _chat(drill, "boom @fault")
    assert trigger.status == 503, trigger
    _assert_terminal(trigger)
    held.join(timeout=30)
    assert not held.is_alive()
    error = next(event["error"] for event in events if "error" in event)
    assert (error["code"], error["stage_id"], error["retryable"]) == (503, STAGE, True)
    assert events[-1] == {"done": True}
    assert not any(
        choice.get("finish_reason") == "abort"
        for event in events
        for choice in event.get("choices", ())
    )

    # During: /health and new requests answer 503 naming the stage.
    _until(lambda: _health(drill).status_code == 503)
    health = _health(drill).json()["error"]
    assert (health["code"], health["stage_id"]) == (503, STAGE)
    assert health["message"].startswith(FAULTED)
    assert 1 <= int(_health(drill).headers["retry-after"]) <= WINDOW_S
    during = [_chat(drill, "during") for _ in range(3)]
    refused = [o for o in during if o.status == 503]
    assert refused, during
    for outcome in refused:
        assert outcome.error is not None
        assert outcome.error["message"].startswith(FAULTED)
        assert 1 <= int(outcome.headers["retry-after"]) <= WINDOW_S
    faulted = metric_samples(drill.server.base_url)
    assert _stage_status(faulted) in ("diagnosing", "unhealthy")
    stage = _status(drill)[STAGE]
    assert stage["status"] in ("diagnosing", "unhealthy")
    assert stage["engines"][0]["status"] in ("diagnosing", "unhealthy")
    # The server's view first, then the engine's entry (its next heartbeat).
    _until(
        lambda: (
            _status(drill)[STAGE]["recovering"]
            and "ft_state" in _status(drill)[STAGE]["engines"][0]
        )
    )
    recovering = _status(drill)[STAGE]
    assert recovering["recovering"].startswith("omni-recovery-")
    assert recovering["engines"][0]["ft_state"] == "recovering"
    # One recovery at a time, in the canonical envelope.
    busy = httpx.post(
        drill.server.base_url + "/v1/fault_tolerance/apply",
        json={"instruction": "retry", "request_id": "operator-1"},
        timeout=5,
    )
    assert busy.status_code == 409
    assert busy.json()["error"]["type"] == "ConflictError"
    bad = httpx.post(
        drill.server.base_url + "/v1/fault_tolerance/apply",
        json={"instruction": "retry"},
        timeout=5,
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "request_id"

    # After: the server recovered it; served again.
    _until(lambda: _health(drill).status_code == 200, within_s=RECOVERY_S + 30)
    after = [_chat(drill, "after") for _ in range(3)]
    assert [o.status for o in after] == [200, 200, 200]
    stop.set()
    loader.join(timeout=60)

    everything = [*before, trigger, *during, *after, *outcomes]
    for outcome in everything:
        _assert_terminal(outcome)
    assert any(o.status == 503 for o in outcomes) or refused
    end = metric_samples(drill.server.base_url)
    assert _stage_status(end) == "healthy"
    assert end[("vllm_omni:stage_faulted_seconds", (("stage", str(STAGE)),))] == 0
    recoveries = sample_delta(
        start, end, "vllm_omni:stage_recoveries_total", stage=str(STAGE)
    )
    assert recoveries == 1
    assert (
        sample_delta(
            start,
            end,
            "vllm_omni:stage_recoveries_total",
            stage=str(STAGE),
            outcome="succeeded",
        )
        == 1
    )
    faulted_refusals = sum(
        1
        for o in [*during, *outcomes]
        if o.error is not None and o.error["message"].startswith(FAULTED)
    )
    assert faulted_refusals >= len(refused)
    # Every refusal is counted (the faulted /health answers are refusals too).
    assert (
        sample_delta(
            start, end, "vllm_omni:engine_faulted_refusals_total", stage=str(STAGE)
        )
        >= faulted_refusals + 1
    )
    last = _status(drill)[STAGE]
    assert last["last_recovery"]["success"] is True
    assert last["engines"] == [{"id": 0, "status": "healthy"}]
    log = drill.server.log()
    assert "stage 1 (thinker) faulted" in log
    assert "recovered from its fault" in log
    # Refusals while it recovers are expected: one INFO line each.
    refusal_lines = [line for line in log.splitlines() if "(engine faulted)" in line]
    assert len(refusal_lines) >= faulted_refusals
    assert all(" INFO " in line for line in refusal_lines)
