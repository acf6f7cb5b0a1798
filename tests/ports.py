"""A free loopback port for a server a test or benchmark starts.

Port 0 hands out a port from the kernel's ephemeral range, the same range
every outgoing connection on the machine draws from (ab, httpx, Ray, ZMQ).
Between the probe and the server's own bind, one of those connections can
take it, and the server then fails with "Address already in use" (seen in
CI). So the port comes from below the ephemeral range, where only listeners
bind, picked at random so parallel test processes rarely meet and probed so
a port already in use is skipped.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 if unknown)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nobody listens on, outside the ephemeral range."""
    highest = ephemeral_start() - 1
    if highest <= _LOWEST:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = random.randint(_LOWEST, highest)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} between {_LOWEST} and {highest}")
