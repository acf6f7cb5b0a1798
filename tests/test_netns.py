"""The test hosts themselves (``tests/netns.py``): a link carries traffic, a
cut stops it both ways without closing anything, a restore brings it back,
and closing the network leaves nothing behind, even a process still running
in a host."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests import netns

_ECHO = (
    "import socket, sys\n"
    "server = socket.create_server((sys.argv[1], 9000))\n"
    "connection, _ = server.accept()\n"
    "while data := connection.recv(64):\n"
    "    connection.sendall(data)\n"
)


@pytest.fixture(scope="module", autouse=True)
def _namespaces_can_be_made() -> None:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"no network-namespace hosts here: {reason}")


def _echo(connection: socket.socket, payload: bytes) -> bytes:
    connection.sendall(payload)
    return connection.recv(64)


def test_a_cut_is_silence_both_ways_and_a_restore_heals_it() -> None:
    with netns.network() as network:
        far = network.host("far")
        link = network.link(None, far)
        echo = network.popen(far, [sys.executable, "-c", _ECHO, link.b_address])
        deadline = time.monotonic() + 30
        while True:
            try:
                connection = socket.create_connection((link.b_address, 9000), 1)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with connection:
            connection.settimeout(1.0)
            assert _echo(connection, b"before") == b"before"
            network.cut(link)
            # Nothing arrives and nothing is reset: the read times out.
            with pytest.raises(TimeoutError):
                _echo(connection, b"during")
            network.restore(link)
            connection.settimeout(30.0)
            # TCP retransmits what waited: the same connection goes on.
            assert connection.recv(64) == b"during"
            assert _echo(connection, b"after") == b"after"
        assert echo.poll() is None
        with network.flap(link, down_s=0.05, up_s=0.05) as flap:
            time.sleep(0.5)
        assert flap.cuts >= 2
    assert echo.poll() is not None
    assert network.leftovers() == []


def test_closing_kills_what_runs_in_the_hosts_and_removes_them() -> None:
    network = netns.Network()
    host = network.host("h")
    other = network.host("o")
    network.link(host, other)
    # Started outside the helper's own popen: found through the namespace.
    sleeper = subprocess.Popen(["ip", "netns", "exec", host.namespace, "sleep", "60"])
    deadline = time.monotonic() + 10
    while sleeper.pid not in network.pids(host):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert network.leftovers() != []
    network.close()
    sleeper.wait(timeout=10)
    assert not psutil.pid_exists(sleeper.pid)
    assert network.leftovers() == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    assert host.namespace not in listed.stdout
