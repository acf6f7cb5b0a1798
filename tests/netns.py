"""Test hosts: Linux network namespaces joined by veth pairs.

A drill that puts a stage "on another host" needs a network between the
hosts that can fail the way a real one does: a partition (no packet in either
direction, nothing closed, nobody told), a heal, a link that flaps. Processes
on one network stack can only crash or be stopped, never be cut off, so this
module builds hosts as network namespaces (iproute2, as root) and joins them
with veth pairs, each link its own /24 of ``10.213.0.0/16`` (private, chosen
to be unlikely to clash; a /24 already routed on this machine is skipped).
The test process's own namespace can be one end of a link (``None`` as the
host): that is how a client or server in the test process reaches a host.

``Network`` owns everything it makes. ``close()`` (the context manager's
exit, so also on a failing test) kills every process still running in its
namespaces (whoever started it), deletes the namespaces (their veth ends go
with them, and with those their peers) and then checks that nothing is
left: ``Network.leftovers()`` names any namespace, link or process that
survived, and ``close`` raises if one did. Traffic goes only to these hosts
and loopback: no route to anywhere else is added.

``unavailable()`` says why namespaces cannot be made here (not root, no
``ip``, no veth support), for ``pytest.skip``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["Flap", "Host", "Link", "Network", "network", "unavailable"]

_SUPERNET = ipaddress.ip_network("10.213.0.0/16")
_PREFIX = "omni-"


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> str:
    """Run ``ip ARGS`` (inside ``namespace`` when given); its stdout."""
    argv = ["ip", *(("-n", namespace) if namespace else ()), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def unavailable() -> str | None:
    """Why network-namespace hosts cannot be made here, or ``None``."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    name = f"{_PREFIX}probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("link", "add", "pa", "type", "veth", "peer", "name", "pb", namespace=name)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a veth pair: {exc}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


@dataclasses.dataclass(frozen=True)
class Host:
    """A network namespace. ``name`` is the test's name for it."""

    name: str
    namespace: str


@dataclasses.dataclass(frozen=True)
class Link:
    """A veth pair between ``a`` and ``b`` (``None``: the test's own host),
    with ``a_address`` and ``b_address`` on its own /24."""

    a: Host | None
    b: Host
    a_device: str
    b_device: str
    a_address: str
    b_address: str

    def address_of(self, host: Host | None) -> str:
        return self.a_address if host == self.a else self.b_address


class Flap:
    """A link going down and up in a thread until stopped; counts its cuts."""

    def __init__(
        self, network: Network, link: Link, *, down_s: float, up_s: float
    ) -> None:
        self._network = network
        self._link = link
        self._down_s = down_s
        self._up_s = up_s
        self._stop = threading.Event()
        self.cuts = 0
        self._thread = threading.Thread(target=self._run, name="netns-flap")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._network.cut(self._link)
            self.cuts += 1
            self._stop.wait(self._down_s)
            self._network.restore(self._link)
            self._stop.wait(self._up_s)

    def __enter__(self) -> Flap:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop flapping; the link is up when this returns."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._network.restore(self._link)


class Network:
    """Hosts and links made for one test module; see the module docstring."""

    def __init__(self) -> None:
        self._token = secrets.token_hex(3)
        self._hosts: list[Host] = []
        self._links: list[Link] = []
        self._processes: list[subprocess.Popen[Any]] = []
        self._subnets: list[ipaddress.IPv4Network] = []
        self._closed = False

    @property
    def token(self) -> str:
        """Six hex digits naming this network's namespaces and devices."""
        return self._token

    # -- building ----------------------------------------------------------------

    def host(self, name: str) -> Host:
        """A new namespace with its loopback up."""
        host = Host(name, f"{_PREFIX}{self._token}-{name}")
        _ip("netns", "add", host.namespace)
        self._hosts.append(host)
        _ip("link", "set", "lo", "up", namespace=host.namespace)
        return host

    def link(self, a: Host | None, b: Host) -> Link:
        """A veth pair from ``a`` (``None``: this process's host) to ``b``,
        up, with ``.1`` and ``.2`` of a /24 not routed here yet."""
        index = len(self._links)
        subnet = self._free_subnet()
        a_address, b_address = (str(subnet.network_address + n) for n in (1, 2))
        # Interface names have at most 15 characters.
        link = Link(
            a,
            b,
            f"om{self._token}a{index}",
            f"om{self._token}b{index}",
            a_address,
            b_address,
        )
        a_ns = a.namespace if a is not None else None
        _ip(
            "link",
            "add",
            link.a_device,
            *(("netns", a_ns) if a_ns else ()),
            "type",
            "veth",
            "peer",
            "name",
            link.b_device,
            "netns",
            b.namespace,
        )
        self._links.append(link)
        for device, address, namespace in (
            (link.a_device, a_address, a_ns),
            (link.b_device, b_address, b.namespace),
        ):
            _ip(
                "addr",
                "add",
                f"{address}/{subnet.prefixlen}",
                "dev",
                device,
                namespace=namespace,
            )
            _ip("link", "set", device, "up", namespace=namespace)
        return link

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of the test supernet that no route of this host covers (two
        test runs side by side on one machine must not share one)."""
        routes = _ip("-4", "route", "show", "table", "all")
        used = {
            ipaddress.ip_network(word, strict=False)
            for line in routes.splitlines()
            for word in line.split()[:2]
            if "/" in word and word[0].isdigit()
        }
        start = int.from_bytes(secrets.token_bytes(1), "big")
        for offset in range(256):
            third = (start + offset) % 256
            subnet = ipaddress.ip_network(f"10.213.{third}.0/24")
            if subnet not in self._subnets and not any(
                subnet.overlaps(u) for u in used if u.prefixlen > 0
            ):
                self._subnets.append(subnet)
                return subnet
        raise RuntimeError(f"no free /24 left in {_SUPERNET}")

    # -- processes ---------------------------------------------------------------

    def popen(
        self, host: Host, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``; killed at ``close`` if still alive."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, *argv], **kwargs
        )
        self._processes.append(process)
        return process

    def run(self, host: Host, argv: Sequence[str], **kwargs: Any) -> str:
        """Run ``argv`` inside ``host`` to completion; its stdout."""
        result = subprocess.run(
            ["ip", "netns", "exec", host.namespace, *argv],
            capture_output=True,
            text=True,
            **kwargs,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} in {host.name}: exit {result.returncode}: "
                f"{result.stderr[-2000:]}"
            )
        return result.stdout

    @staticmethod
    def pids(host: Host) -> list[int]:
        """Every process running in ``host``'s namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", host.namespace],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return [int(word) for word in out.split()]

    # -- failures ----------------------------------------------------------------

    def cut(self, link: Link) -> None:
        """Partition: both ends down. Nothing is closed or reset: each side
        just stops hearing the other, as when a switch or cable fails."""
        self._set(link, "down")

    def restore(self, link: Link) -> None:
        """Heal: both ends up again (addresses and routes come back)."""
        self._set(link, "up")

    def _set(self, link: Link, state: str) -> None:
        _ip("link", "set", link.a_device, state, namespace=_ns(link.a))
        _ip("link", "set", link.b_device, state, namespace=link.b.namespace)

    def flap(self, link: Link, *, down_s: float, up_s: float) -> Flap:
        """A context manager that flaps ``link`` until its block ends."""
        return Flap(self, link, down_s=down_s, up_s=up_s)

    # -- teardown ----------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """What of this network still exists: namespaces, links, processes."""
        left: list[str] = []
        namespaces = _ip("netns", "list", check=False)
        for host in self._hosts:
            if host.namespace in namespaces.split():
                pids = self.pids(host)
                left.append(f"namespace {host.namespace} (processes {pids})")
        links = _ip("-o", "link", "show", check=False)
        for link in self._links:
            for device in (link.a_device, link.b_device):
                if f" {device}@" in links or f" {device}:" in links:
                    left.append(f"link {device}")
        left += [
            f"process {p.pid} ({' '.join(map(str, p.args))[:80]})"
            for p in self._processes
            if p.poll() is None
        ]
        return left

    def close(self) -> None:
        """Kill what runs in the hosts, delete them, check nothing is left."""
        if self._closed:
            return
        self._closed = True
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        deadline = time.monotonic() + 15
        survivors: list[str] = []
        for host in self._hosts:
            while pids := self.pids(host):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                if time.monotonic() > deadline:
                    # Deleting the name would hide them, not end them.
                    survivors += [f"process {pid} in {host.name}" for pid in pids]
                    break
                time.sleep(0.05)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        for host in self._hosts:
            _ip("netns", "del", host.namespace, check=False)
        for link in self._links:
            if link.a is None:
                _ip("link", "del", link.a_device, check=False)
        left = survivors + self.leftovers()
        if left:
            raise AssertionError(f"the test network was not torn down: {left}")

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _ns(host: Host | None) -> str | None:
    return host.namespace if host is not None else None


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A ``Network`` torn down (and checked) whatever happens in the block."""
    net = Network()
    try:
        yield net
    finally:
        net.close()
