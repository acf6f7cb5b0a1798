"""A stage on another host, cut off by a real network partition (``tcp://``).

The far host is a network namespace joined to this one by a veth pair
(``tests/netns.py``). Two ``vllm-omni serve`` processes run here (the
second with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``), each with its talker
(stage 1, ``remote: true``) in a stage worker on the far host, connected
over the link to the ``orchestrator_address`` of the pipeline file; thinker
and vocoder run here, so a text request never needs the far host. Cutting
the link (both veth ends down) is a partition: nothing is closed or reset,
each side just stops hearing the other.

The drills are ``tests/partition_drills.py``'s, shared with the Ray
backend: a 2.5 s partition then heal, a link flapping for 5 s, a cut while
a stream is mid-way, and, last, a partition that outlasts the heartbeat
timeout (6 s), after which each far stage must stop by itself within its
orchestrator timeout (12 s), leaving nothing on the far host. The drills
take about a minute; starting the servers and far stages most of the rest.
The module's network is torn down, and checked empty, at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import yaml

from tests import netns
from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.servers import free_port
from tests.e2e.test_leaks import find_host_leaks, find_leaks
from tests.partition_drills import (
    FAR_STAGE,
    HEARTBEAT_TIMEOUT_S,
    KEEP_ALIVE,
    ORCHESTRATOR_TIMEOUT_S,
    SILENCE_TIMEOUT_S,
    Deployment,
    ask,
    cut_mid_stream,
    flapping_link,
    long_partition,
    pipeline,
    short_partition,
)

# Generous: starting two servers and their far stages takes minutes on a
# loaded two-core host.
# A drill: run after the main suite (``-m drill``, .ci/run).
pytestmark = [pytest.mark.timeout(300), pytest.mark.drill]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"no network-namespace hosts here: {reason}")
    with netns.network() as network:
        far = network.host("far")
        link = network.link(None, far)
        servers: dict[str, OmniServer] = {}
        stages: dict[str, subprocess.Popen[bytes]] = {}
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
                servers[name] = start_server(directory, path, env=env)
                stages[name] = network.popen(
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
                    stdout=(directory / "far-stage.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            for server in servers.values():
                server.wait_ready(timeout=280)
            addresses = [link.a_address, link.b_address]
            yield Deployment(
                network=network,
                far=far,
                link=link,
                servers=servers,
                far_stage_pids=lambda name: (
                    [stages[name].pid] if stages[name].poll() is None else []
                ),
                leaks=lambda text: find_leaks(text) + find_host_leaks(text, addresses),
            )
        finally:
            for server in servers.values():
                _stop_with_its_processes(server)


def _stop_with_its_processes(server: OmniServer) -> None:
    """Stop a server here (on this host, outside the test network) and check
    that its whole process tree (launcher, local stages) is gone."""
    tree: list[psutil.Process] = []
    if server.proc.poll() is None:
        tree = psutil.Process(server.proc.pid).children(recursive=True)
    server.stop()
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == [], alive


def _far_stage_log(deployment: Deployment, name: str) -> str:
    return (deployment.servers[name].log_path.parent / "far-stage.log").read_text()


def test_the_talkers_run_on_the_far_host(deployment: Deployment) -> None:
    far = deployment.network.pids(deployment.far)
    assert sorted(far) == sorted(
        pid for name in ("main", "alive") for pid in deployment.far_stage_pids(name)
    )
    assert ask(deployment.client(), "over the link", "both").status == 200


def test_a_short_partition_is_504_and_503_then_the_stage_serves_again(
    deployment: Deployment, record_property: Any
) -> None:
    timings = short_partition(deployment)
    for name, value in timings.items():
        record_property(name, round(value, 2))
    print(f"tcp, {SILENCE_TIMEOUT_S} s silence: {timings}")
    assert "duplicate request" not in _far_stage_log(deployment, "main")


def test_a_flapping_link_loses_no_request_and_kills_nothing(
    deployment: Deployment, record_property: Any
) -> None:
    counts = flapping_link(deployment)
    for name, value in counts.items():
        record_property(name, value)
    print(f"tcp flapping: {counts}")
    assert "duplicate request" not in _far_stage_log(deployment, "main")


def test_a_cut_mid_stream_ends_it_with_one_error_event(
    deployment: Deployment,
) -> None:
    cut_mid_stream(deployment)


@pytest.mark.timeout(90)
def test_a_long_partition_kills_the_engine_and_the_far_stages_stop(
    deployment: Deployment, record_property: Any
) -> None:
    """Last in the module: it kills both engines. Each far stage stops by
    itself within its orchestrator timeout of the cut (exit 0, saying why),
    and nothing is left on the far host."""
    cut, timings = long_partition(deployment)
    for name in ("main", "alive"):
        # Its orchestrator timeout counts the time its own loop ran: on a
        # loaded host a late wake-up of its watcher is not the orchestrator's
        # silence (``vllm_omni.engine.liveness``), hence the slack.
        deadline = cut + ORCHESTRATOR_TIMEOUT_S + 5.0
        while deployment.far_stage_pids(name):
            assert time.monotonic() < deadline, _far_stage_log(deployment, name)
            time.sleep(0.05)
        assert f"orchestrator silent for {ORCHESTRATOR_TIMEOUT_S:g} s, exiting" in (
            _far_stage_log(deployment, name)
        )
    timings["cut_to_far_stages_stopped_s"] = time.monotonic() - cut
    for name, value in timings.items():
        record_property(name, round(value, 2))
    print(f"tcp, {HEARTBEAT_TIMEOUT_S} s heartbeat: {timings}")
    assert deployment.network.pids(deployment.far) == []
