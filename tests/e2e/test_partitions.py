"""A stage on another host, cut off by a real network partition (``tcp://``).

The far host is a network namespace joined to this one by a veth pair
(``tests/netns.py``): two ``vllm-omni serve`` processes run here, each with
its talker (stage 1, ``remote: true``) in a stage worker on the far host,
connected over the link to the ``orchestrator_address`` in the pipeline
file. Thinker and vocoder run here, so text requests never need the far
host (``tests/partition_drills.py`` has the pipeline and the clients).
Cutting the link (both veth ends down) is a partition: nothing is closed or
reset, each side just stops hearing the other.

Timeouts are short so the module takes about a minute: a stage not heard
from for ``silence_timeout_s`` 1.5 s is silent (504 for what it holds, 503
with ``Retry-After`` for what needs it), for ``heartbeat_timeout_s`` 6 s
dead; the far stage gives up on a silent orchestrator after 12 s (twice the
heartbeat timeout). The drills, each with requests of every kind in flight:
a 2.5 s partition then heal; a link flapping (300 ms down, 300 ms up) for
5 s; a cut while a stream is mid-way; and, last, a partition that outlasts
the heartbeat (the main server exits 1, the keep-alive one answers
``/health`` 503, the far stages stop by themselves). Each drill compares
the server's metrics with what its clients saw and scans every byte they
saw for host addresses and tracebacks; the module's network is torn down
and checked empty at the end.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests import netns
from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.servers import free_port, metric_samples
from tests.e2e.test_leaks import find_host_leaks, find_leaks
from tests.partition_drills import (
    FAR_STAGE,
    GENERIC,
    STOPPED,
    Outcome,
    Traffic,
    chat,
    check_each_request_ended_once,
    check_metrics,
    check_silent_stage_outcome,
    metrics_settled,
    pipeline,
    stream,
)

pytestmark = pytest.mark.timeout(120)

HEARTBEAT_TIMEOUT_S = 6.0
SILENCE_TIMEOUT_S = 1.5
ORCHESTRATOR_TIMEOUT_S = 2 * HEARTBEAT_TIMEOUT_S
SHORT_CUT_S = 2.5
KEEP_ALIVE = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}


class FarStage:
    """A talker's stage worker on the far host, with its log."""

    def __init__(self, process: Any, log: Path) -> None:
        self.process = process
        self.log = log


@pytest.fixture(scope="module")
def network() -> Iterator[netns.Network]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"no network-namespace hosts here: {reason}")
    with netns.network() as net:
        yield net


@pytest.fixture(scope="module")
def far(network: netns.Network) -> netns.Host:
    return network.host("far")


@pytest.fixture(scope="module")
def link(network: netns.Network, far: netns.Host) -> netns.Link:
    return network.link(None, far)


@pytest.fixture(scope="module")
def deployment(
    network: netns.Network,
    far: netns.Host,
    link: netns.Link,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[OmniServer, FarStage]]]:
    """The main server and the keep-alive one, each with its far talker."""
    started: dict[str, tuple[OmniServer, FarStage]] = {}
    try:
        for name, env in (("main", {}), ("alive", KEEP_ALIVE)):
            directory = tmp_path_factory.mktemp(f"partition-{name}")
            address = f"tcp://{link.a_address}:{free_port(link.a_address)}"
            path = directory / "pipeline.yaml"
            path.write_text(
                yaml.safe_dump(
                    pipeline(
                        near={},
                        far={"remote": True},
                        orchestrator_address=address,
                        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                        silence_timeout_s=SILENCE_TIMEOUT_S,
                    )
                )
            )
            server = start_server(directory, path, env=env)
            log = directory / "far-stage.log"
            process = network.popen(
                far,
                [
                    sys.executable,
                    "-m",
                    "vllm_omni.engine.stage_worker",
                    "--connect",
                    address,
                    "--pipeline",
                    str(path),
                    "--stage-id",
                    str(FAR_STAGE),
                    "--orchestrator-timeout-s",
                    str(ORCHESTRATOR_TIMEOUT_S),
                ],
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
            )
            started[name] = (server, FarStage(process, log))
        for server, _ in started.values():
            server.wait_ready(timeout=150)
        yield started
    finally:
        for server, _ in started.values():
            server.stop()


def _client(server: OmniServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60
    )


def _check_no_leaks(outcomes: list[Outcome], link: netns.Link) -> None:
    addresses = [link.a_address, link.b_address]
    leaks = [
        (o.kind, find_leaks(o.seen) + find_host_leaks(o.seen, addresses))
        for o in outcomes
    ]
    assert [leak for leak in leaks if leak[1]] == []


def _check_alive(server: OmniServer, far_stage: FarStage, pid: int) -> None:
    """Served throughout: no engine death, the same far stage process."""
    assert server.proc.poll() is None
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert "engine dead" not in server.log()
    assert far_stage.process.poll() is None and far_stage.process.pid == pid
    assert "duplicate request" not in far_stage.log.read_text()


def test_the_talker_runs_on_the_far_host(
    network: netns.Network,
    far: netns.Host,
    deployment: dict[str, tuple[OmniServer, FarStage]],
) -> None:
    server, far_stage = deployment["main"]
    assert sorted(network.pids(far)) == sorted(
        stage.process.pid for _, stage in deployment.values()
    )
    served = chat(_client(server), "over the link", "both")
    assert served.status == 200
    assert far_stage.process.poll() is None


def _held(client: openai.OpenAI, prompt: str, kind: str, sink: list[Outcome]) -> Any:
    thread = threading.Thread(target=lambda: sink.append(chat(client, prompt, kind)))
    thread.start()
    return thread


def test_a_short_partition_is_504_and_503_then_the_stage_serves_again(
    network: netns.Network,
    link: netns.Link,
    deployment: dict[str, tuple[OmniServer, FarStage]],
    record_property: Any,
) -> None:
    server, far_stage = deployment["main"]
    client = _client(server)
    pid = far_stage.process.pid
    before = metric_samples(server.base_url)
    held: list[Outcome] = []
    holder = _held(client, "hold @talkhang", "audio", held)
    time.sleep(1.0)  # at the talker, which holds it
    with Traffic(client, ["text", "audio", "both"]) as traffic:
        time.sleep(0.5)
        network.cut(link)
        cut = time.monotonic()
        holder.join(timeout=10)
        time.sleep(max(0.0, cut + SHORT_CUT_S - time.monotonic()))
        network.restore(link)
        healed = time.monotonic()
        deadline = healed + 15
        while not [
            o
            for o in traffic.outcomes
            if o.kind == "audio" and o.status == 200 and o.sent > healed
        ]:
            assert time.monotonic() < deadline, "not served after the heal"
            time.sleep(0.05)
        time.sleep(0.5)
    outcomes = held + traffic.outcomes
    [timed_out] = held
    assert (timed_out.code, timed_out.error["type"], timed_out.stage_id) == (  # type: ignore[index]
        504,
        "GatewayTimeoutError",
        FAR_STAGE,
    )
    assert timed_out.error["message"] == STOPPED  # type: ignore[index]
    check_each_request_ended_once(outcomes)
    during = [o for o in outcomes if cut + SILENCE_TIMEOUT_S + 0.2 < o.sent < healed]
    for outcome in during:
        if outcome.kind != "text":
            check_silent_stage_outcome(outcome)
    assert {o.code for o in during if o.kind == "audio"} == {503}
    assert {o.code for o in during if o.kind == "text"} == {200}
    first_refused = min(o.done for o in outcomes if o.code in (503, 504))
    first_served = min(
        o.done
        for o in outcomes
        if o.kind == "audio" and o.status == 200 and o.sent > healed
    )
    timings = {
        "cut_to_first_503_504_s": round(first_refused - cut, 2),
        "cut_to_held_504_s": round(timed_out.done - cut, 2),
        "heal_to_first_served_s": round(first_served - healed, 2),
    }
    for name, value in timings.items():
        record_property(name, value)
    print(f"tcp short partition: {timings}")
    assert timings["cut_to_first_503_504_s"] < SILENCE_TIMEOUT_S + 1.5
    after = metrics_settled(server.base_url, before, len(outcomes))
    check_metrics(before, after, outcomes)
    _check_alive(server, far_stage, pid)
    _check_no_leaks(outcomes, link)


def test_a_flapping_link_loses_no_request_and_kills_nothing(
    network: netns.Network,
    link: netns.Link,
    deployment: dict[str, tuple[OmniServer, FarStage]],
    record_property: Any,
) -> None:
    server, far_stage = deployment["main"]
    client = _client(server)
    pid = far_stage.process.pid
    before = metric_samples(server.base_url)
    with Traffic(client, ["text", "audio", "both"]) as traffic:
        with network.flap(link, down_s=0.3, up_s=0.3) as flap:
            time.sleep(5.0)
        stopped = time.monotonic()
        deadline = stopped + 15
        while not [
            o
            for o in traffic.outcomes
            if o.kind == "audio" and o.status == 200 and o.sent > stopped
        ]:
            assert time.monotonic() < deadline, "not served after the flapping"
            time.sleep(0.05)
    outcomes = traffic.outcomes
    check_each_request_ended_once(outcomes)
    refused = sum(1 for o in outcomes if o.code != 200)
    record_property("flap_cuts", flap.cuts)
    record_property("flap_requests", len(outcomes))
    record_property("flap_refused", refused)
    print(f"tcp flap: {flap.cuts} cuts, {len(outcomes)} requests, {refused} refused")
    after = metrics_settled(server.base_url, before, len(outcomes))
    check_metrics(before, after, outcomes)
    _check_alive(server, far_stage, pid)
    _check_no_leaks(outcomes, link)


def test_a_cut_mid_stream_ends_it_with_one_error_event(
    network: netns.Network,
    link: netns.Link,
    deployment: dict[str, tuple[OmniServer, FarStage]],
) -> None:
    server, far_stage = deployment["main"]
    pid = far_stage.process.pid
    before = metric_samples(server.base_url)
    started: list[Outcome] = []
    streamer = threading.Thread(
        target=stream, args=(server.base_url, "speak @talkhang", "both", started)
    )
    streamer.start()
    deadline = time.monotonic() + 10
    while not started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.5)  # the text is out; the talker holds the rest
    network.cut(link)
    streamer.join(timeout=15)
    network.restore(link)
    [streamed] = started
    assert streamed.status == 200
    assert streamed.events[0].startswith('{"id"')  # it was mid-way
    assert streamed.events[-1] == "[DONE]"
    errors = [e for e in streamed.events if '"error"' in e]
    assert errors == [streamed.events[-2]]
    assert (streamed.code, streamed.error["type"], streamed.stage_id) == (  # type: ignore[index]
        504,
        "GatewayTimeoutError",
        FAR_STAGE,
    )
    served = _until_served(_client(server))
    outcomes = [streamed, *served]
    check_each_request_ended_once(outcomes)
    after = metrics_settled(server.base_url, before, len(outcomes))
    check_metrics(before, after, outcomes)
    _check_alive(server, far_stage, pid)
    _check_no_leaks(outcomes, link)


def _until_served(client: openai.OpenAI) -> list[Outcome]:
    """Audio requests, each after the last one's Retry-After, until one is
    served (the heal may take a retransmission or two); all outcomes."""
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + 15
    while not outcomes or outcomes[-1].status != 200:
        assert time.monotonic() < deadline, outcomes
        if outcomes:
            time.sleep(float(outcomes[-1].retry_after or 1))
        outcomes.append(chat(client, "back again", "audio"))
    return outcomes


@pytest.mark.timeout(90)
def test_a_long_partition_kills_the_engine_and_the_far_stages_stop(
    network: netns.Network,
    far: netns.Host,
    link: netns.Link,
    deployment: dict[str, tuple[OmniServer, FarStage]],
    record_property: Any,
) -> None:
    """Last in the module: it kills both engines."""
    (server, _), (alive, _) = deployment["main"], deployment["alive"]
    held: dict[str, list[Outcome]] = {"main": [], "alive": [], "talker": []}
    holders = [
        _held(_client(server), "think @hang", "text", held["main"]),
        _held(_client(alive), "think @hang", "text", held["alive"]),
        _held(_client(server), "talk @talkhang", "audio", held["talker"]),
    ]
    time.sleep(1.0)
    network.cut(link)
    cut = time.monotonic()
    for holder in holders:
        holder.join(timeout=30)
    # At the far stage: 504 once it is silent, before the engine dies.
    [at_talker] = held["talker"]
    check_silent_stage_outcome(at_talker)
    assert at_talker.code == 504
    # In flight here when the engine died: 500 naming the far stage.
    for [dead] in (held["main"], held["alive"]):
        assert (dead.status, dead.error["type"], dead.stage_id) == (  # type: ignore[index]
            500,
            "InternalServerError",
            FAR_STAGE,
        )
        assert dead.error["message"] == GENERIC  # type: ignore[index]
    died = held["main"][0].done - cut
    record_property("cut_to_engine_death_s", round(died, 2))
    assert HEARTBEAT_TIMEOUT_S - 1.0 < died < HEARTBEAT_TIMEOUT_S + 2.0
    assert server.proc.wait(timeout=20) == 1
    assert "engine dead: stage 1 (talker) failed fatally: stage heartbeat lost" in (
        server.log()
    )
    # Keep-alive: the server stays up, /health 503, new requests the dead 500.
    health = httpx.get(alive.base_url + "/health")
    assert health.status_code == 503
    after_death = chat(_client(alive), "anyone?", "text")
    assert (after_death.status, after_death.stage_id) == (500, FAR_STAGE)
    assert alive.proc.poll() is None
    # The far side: each stage stops by itself within its orchestrator
    # timeout of the cut, and nothing is left on the far host.
    for name in ("main", "alive"):
        far_stage = deployment[name][1]
        left = cut + ORCHESTRATOR_TIMEOUT_S + 2.0 - time.monotonic()
        assert far_stage.process.wait(timeout=max(0.1, left)) == 0
        assert f"orchestrator silent for {ORCHESTRATOR_TIMEOUT_S:g} s, exiting" in (
            far_stage.log.read_text()
        )
    stopped = time.monotonic() - cut
    record_property("cut_to_far_stages_stopped_s", round(stopped, 2))
    print(f"tcp long partition: engine dead {died:.2f} s, far stages {stopped:.2f} s")
    assert network.pids(far) == []
    seen = [
        at_talker,
        *held["main"],
        *held["alive"],
        after_death,
        Outcome("health", cut, status=503, seen=health.text),
    ]
    _check_no_leaks(seen, link)
