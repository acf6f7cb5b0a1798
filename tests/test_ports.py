"""The port helper every test server and benchmark uses."""

from __future__ import annotations

import socket

from tests.ports import ephemeral_start, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < ephemeral_start() for port in ports)
    assert len(ports) > 1
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_skipped() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        taken = busy.getsockname()[1]
        assert all(free_port() != taken for _ in range(200))
