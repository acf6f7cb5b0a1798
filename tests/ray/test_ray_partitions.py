"""A Ray worker node on another host, cut off by a real network partition.

Three hosts (``tests/netns.py``): this one (the clients); ``head``, a
network namespace running the Ray head and two ``vllm-omni serve
--worker-backend ray`` processes (the second with
``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``), joined to this host by one veth pair;
and ``far``, a namespace running a Ray worker node joined to the head by
another. Each server's thinker and vocoder are placed on the head, its
talker on the far node (custom resources ``near`` / ``far``), so a text
request never needs the far host. Cutting the head-far link (both ends
down) is a partition: the talker's ZMQ wire, its Ray probe and Ray's own
health checks all stop getting through, nothing is closed.

Ray's health check is set so that the GCS declares a node dead after about
ten seconds (period 1 s, timeout 1 s, 5 failures): well past the short
partition, before the far stage gives up on its orchestrator. The drills
are ``tests/partition_drills.py``'s, shared with the ``tcp://`` backend,
with the same timeouts (silent after 1.5 s, dead after 6 s; probe every
0.25 s, 1 s to answer). After the long partition each talker actor's
process stops by itself within its orchestrator timeout (twice the
heartbeat timeout, 12 s); once the link heals, the far raylet learns that
the GCS declared its node dead and exits with what it ran (only ``ray
start``'s log monitor stays, until ``ray stop``). Everything Ray
started, on both hosts, is killed and checked gone by the network's
teardown. The drills take about a minute and a half; starting the cluster
and the servers most of the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests import netns
from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.test_leaks import find_host_leaks, find_leaks, find_ray_leaks
from tests.partition_drills import (
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

# A drill: run after the main suite (``-m drill``, .ci/run).
pytestmark = [pytest.mark.timeout(300), pytest.mark.drill]

RAY_PORT = 6379
# The GCS declares a silent node dead after about 10 s (5 failed checks,
# each a 1 s timeout after a 1 s period).
HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "5",
}
PROBE = {"probe_interval_s": 0.25, "probe_timeout_s": 1.0}
# A real multi-node cluster (this package's conftest says otherwise for the
# loopback-only tests): every node is on a test host, bound to its address
# on the test subnet.
MULTI_NODE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
_READY = re.compile(r"stage 1 \(talker\) ready, pid (\d+)")
_NODE_ID = re.compile(r"node_id=([0-9a-f]{56})")


def _ray(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "ray"), *args]


def _far_stage_pids(
    network: netns.Network, far: netns.Host, server: OmniServer
) -> list[int]:
    """The talker actor's process of ``server`` (the pid its Ready named),
    while it runs on the far host."""
    found = _READY.search(server.log())
    return [int(found[1])] if found and int(found[1]) in network.pids(far) else []


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"no network-namespace hosts here: {reason}")
    with netns.network() as network:
        # Short: Ray's unix sockets live under it (at most 107 characters).
        ray_dir = Path(f"/tmp/omr-{network.token}")
        head, far = network.host("head"), network.host("far")
        client_link = network.link(None, head)
        link = network.link(head, far)
        gcs = f"{link.a_address}:{RAY_PORT}"
        servers: dict[str, OmniServer] = {}
        try:
            network.run(
                head,
                _ray(
                    "start",
                    "--head",
                    f"--node-ip-address={link.a_address}",
                    f"--port={RAY_PORT}",
                    "--num-cpus=0",
                    '--resources={"near": 10}',
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                    f"--temp-dir={ray_dir}/head",
                ),
                env={**os.environ, **MULTI_NODE, **HEALTH_CHECKS},
                timeout=180,
            )
            network.run(
                far,
                _ray(
                    "start",
                    f"--address={gcs}",
                    f"--node-ip-address={link.b_address}",
                    "--num-cpus=1",
                    '--resources={"far": 10}',
                    "--disable-usage-stats",
                    f"--temp-dir={ray_dir}/far",
                ),
                env={**os.environ, **MULTI_NODE},
                timeout=180,
            )
            node_ids = [_node_id(ray_dir / node) for node in ("head", "far")]
            for name, env in (("main", {}), ("alive", KEEP_ALIVE)):
                directory = tmp_path_factory.mktemp(f"ray-partition-{name}")
                path = directory / "pipeline.yaml"
                path.write_text(
                    yaml.safe_dump(
                        pipeline(
                            near={"ray": {"resources": {"near": 1}}},
                            far={"ray": {"resources": {"far": 1}}},
                            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                            silence_timeout_s=SILENCE_TIMEOUT_S,
                            ray=PROBE,
                        )
                    )
                )
                servers[name] = start_server(
                    directory,
                    path,
                    env={**env, **MULTI_NODE},
                    host=client_link.b_address,
                    command_prefix=("ip", "netns", "exec", head.namespace),
                    extra_args=("--worker-backend", "ray", "--ray-address", gcs),
                )
            for server in servers.values():
                server.wait_ready(timeout=280)
            private = [client_link.a_address, client_link.b_address]
            private += [link.a_address, link.b_address]

            def leaks(text: str) -> list[str]:
                return (
                    find_leaks(text)
                    + find_host_leaks(text, private)
                    + find_ray_leaks(text, gcs, node_ids)
                )

            yield Deployment(
                network=network,
                far=far,
                link=link,
                servers=servers,
                far_stage_pids=lambda name: _far_stage_pids(
                    network, far, servers[name]
                ),
                leaks=leaks,
            )
        finally:
            for server in servers.values():
                server.stop()
            network.close()
            shutil.rmtree(ray_dir, ignore_errors=True)


def _node_id(temp_dir: Path) -> str:
    """A node's id, from its raylet's log (for the leak scan)."""
    log = temp_dir / "session_latest" / "logs" / "raylet.out"
    deadline = time.monotonic() + 30
    while not (found := _NODE_ID.search(log.read_text() if log.exists() else "")):
        assert time.monotonic() < deadline, log
        time.sleep(0.1)
    return found[1]


def _title(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def test_the_talkers_run_on_the_far_node(deployment: Deployment) -> None:
    for name in ("main", "alive"):
        [pid] = deployment.far_stage_pids(name)
        assert _title(pid).startswith("ray::_StageActor")
    assert ask(deployment.client(), "over the link", "both").status == 200


def test_a_short_partition_is_504_and_503_then_the_stage_serves_again(
    deployment: Deployment, record_property: Any
) -> None:
    timings = short_partition(deployment)
    for name, value in timings.items():
        record_property(name, round(value, 2))
    print(f"ray, {SILENCE_TIMEOUT_S} s silence, probe {PROBE}: {timings}")


def test_a_flapping_link_loses_no_request_and_kills_nothing(
    deployment: Deployment, record_property: Any
) -> None:
    counts = flapping_link(deployment)
    for name, value in counts.items():
        record_property(name, value)
    print(f"ray flapping: {counts}")


def test_a_cut_mid_stream_ends_it_with_one_error_event(
    deployment: Deployment,
) -> None:
    cut_mid_stream(deployment)


@pytest.mark.timeout(120)
def test_a_long_partition_kills_the_engine_and_the_far_stages_stop(
    deployment: Deployment, record_property: Any
) -> None:
    """Last in the module: it kills both engines. Each talker actor's process
    stops by itself within its orchestrator timeout of the cut; after the
    heal the far raylet, declared dead by the GCS meanwhile, exits with its
    workers and agents."""
    far_pids = {name: deployment.far_stage_pids(name) for name in ("main", "alive")}
    cut, timings = long_partition(deployment)
    network, far = deployment.network, deployment.far
    # As for the tcp stage: its timeout counts its own running time.
    deadline = cut + ORCHESTRATOR_TIMEOUT_S + 5.0
    for pids in far_pids.values():
        while set(pids) & set(network.pids(far)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    timings["cut_to_far_stages_stopped_s"] = time.monotonic() - cut
    network.restore(deployment.link)
    healed = time.monotonic()
    while ray := [
        title
        for pid in network.pids(far)
        if (title := _title(pid)).startswith("ray::") or "raylet" in title
    ]:
        assert time.monotonic() < healed + 30, ray
        time.sleep(0.2)
    timings["heal_to_far_raylet_gone_s"] = time.monotonic() - healed
    for name, value in timings.items():
        record_property(name, round(value, 2))
    print(f"ray, {HEARTBEAT_TIMEOUT_S} s heartbeat: {timings}")
    # Left: only the log monitor ``ray start`` runs beside the raylet (a
    # node daemon of Ray's, ended by ``ray stop``; the teardown kills it).
    left = [_title(pid) for pid in network.pids(far)]
    assert all("ray/_private/log_monitor.py" in title for title in left), left
