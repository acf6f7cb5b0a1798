"""Benchmark a remote stage cut off by a real partition, against its timeouts.

Two network-namespace hosts (``tests/netns.py``; root only: without it the
module reports one row saying why) joined by a veth pair: the engine
(``AsyncOmni`` over ``tcp://``, default timeouts: ``silence_timeout_s`` 3,
``heartbeat_timeout_s`` 10) on one, its one stage, ``remote: true``, in a
stage worker on the other. A cut is both veth ends down. Measured, in a
process inside the engine's host:

- ``cut to first 504`` / ``cut to first 503``: a request the stage holds (a
  hang fault) fails when the stage turns silent; then a new request is
  refused. Baseline: the configured ``silence_timeout_s``.
- ``heal to first served, cut N s``: after a cut of N seconds, requests
  every 50 ms until one is served. It grows with the cut: TCP backs off its
  retransmissions while the link is down, and the stage's messages after
  the heal wait for the next one. The same again with
  ``net.ipv4.tcp_rto_max_ms=1000`` on both hosts (Linux 6.15+), which caps
  that backoff.
- ``cut to engine death``: a cut for good, until the engine is dead.
  Baseline: the configured ``heartbeat_timeout_s``.

``python benchmarks/bench_partition.py`` prints a table; ``run()`` returns
the rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

_CUTS_S = (2.0, 4.0, 6.0, 8.0)
_RTO_CAP_MS = 1000
_SILENCE_S = 3.0
_HEARTBEAT_S = 10.0


def _set_link(namespaces: list[str], devices: list[str], state: str) -> None:
    for namespace, device in zip(namespaces, devices, strict=True):
        subprocess.run(
            ["ip", "-n", namespace, "link", "set", device, state], check=True
        )


async def _measure(link: dict[str, Any], death: bool) -> dict[str, float]:
    cuts: list[float] = link["cuts"]
    """Inside the engine's host: the engine, its far stage, the cuts."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    namespaces, devices = link["namespaces"], link["devices"]
    path = Path(tempfile.mkdtemp(prefix="bench-partition-")) / "pipeline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "bench-partition",
                "orchestrator_address": f"tcp://{link['address']}:0",
                "stages": [{"id": 0, "name": "far", "kind": "text", "remote": True}],
                "faults": [{"stage": 0, "marker": "@hang", "action": "hang"}],
            }
        )
    )
    engine = AsyncOmni(path)
    starting = asyncio.create_task(engine.start())
    while not engine.address:
        await asyncio.sleep(0.05)
    worker = ["vllm_omni.engine.stage_worker", "--connect", engine.address]
    worker += ["--pipeline", str(path), "--stage-id", "0", "--log-level", "error"]
    worker += ["--orchestrator-timeout-s", str(3 * _HEARTBEAT_S)]
    stage = subprocess.Popen(
        ["ip", "netns", "exec", namespaces[1], sys.executable, "-m", *worker]
    )
    results: dict[str, float] = {}
    n = 0

    async def ask(prompt: str) -> BaseException | None:
        nonlocal n
        n += 1
        try:
            async for _ in engine.generate(prompt, request_id=f"b{n}"):
                pass
        except Exception as exc:
            return exc
        return None

    try:
        await starting
        held = asyncio.create_task(ask("held @hang"))
        await asyncio.sleep(1.0)
        _set_link(namespaces, devices, "down")
        cut = time.monotonic()
        await held
        results["first_504"] = time.monotonic() - cut
        await ask("refused")
        results["first_503"] = time.monotonic() - cut
        await asyncio.sleep(max(0.0, cut + cuts[0] - time.monotonic()))
        for index, length in enumerate(cuts):
            if index:
                await asyncio.sleep(2.0)
                _set_link(namespaces, devices, "down")
                await asyncio.sleep(length)
            _set_link(namespaces, devices, "up")
            healed = time.monotonic()
            while await ask("back") is not None:
                await asyncio.sleep(0.05)
            results[f"heal_{length:g}"] = time.monotonic() - healed
        if death:
            await asyncio.sleep(2.0)
            _set_link(namespaces, devices, "down")
            cut = time.monotonic()
            while not engine.errored:
                await asyncio.sleep(0.02)
            results["death"] = time.monotonic() - cut
    finally:
        engine.shutdown()
        stage.kill()
    return results


def _measure_main() -> None:
    link = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(_measure(link, death=link["death"]))))


def _one_setting(rto_cap_ms: int | None, cuts: tuple[float, ...]) -> dict[str, float]:
    from tests.netns import network

    with network() as net:
        near, far = net.host("near"), net.host("far")
        link = net.link(near, far)
        if rto_cap_ms is not None:
            for host in (near, far):
                net.run(host, ["sysctl", "-q", f"net.ipv4.tcp_rto_max_ms={rto_cap_ms}"])
        spec = {
            "address": link.a_address,
            "namespaces": [near.namespace, far.namespace],
            "devices": [link.a_device, link.b_device],
            "death": rto_cap_ms is None,
            "cuts": list(cuts),
        }
        out = net.run(
            near,
            [
                sys.executable,
                "-c",
                "from benchmarks.bench_partition import _measure_main as m; m()",
                json.dumps(spec),
            ],
            timeout=600,
        )
    return json.loads(out.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict[str, object]]:
    """The rows; ``quick``: one short cut, no capped setting (CI: it runs)."""
    from tests.netns import unavailable

    reason = unavailable()
    if reason is not None:
        return [{"benchmark": f"partition (skipped: {reason})", "unit": "–"}]
    cuts = _CUTS_S[:1] if quick else _CUTS_S
    default = _one_setting(None, cuts)
    capped = {} if quick else _one_setting(_RTO_CAP_MS, cuts)
    rows: list[dict[str, object]] = []
    for key, name, baseline in (
        ("first_504", "tcp: cut to first 504 (silence_timeout_s 3)", _SILENCE_S),
        ("first_503", "tcp: cut to first 503 (silence_timeout_s 3)", _SILENCE_S),
        ("death", "tcp: cut to engine death (heartbeat_timeout_s 10)", _HEARTBEAT_S),
    ):
        rows.append(
            {
                "benchmark": name,
                "ours": round(default[key], 2),
                "baseline": baseline,
                "ratio": round(default[key] / baseline, 3),
                "unit": "s",
            }
        )
    for length in cuts:
        rows.append(
            {
                "benchmark": f"tcp: heal to first served, cut {length:g} s "
                f"(vs tcp_rto_max_ms {_RTO_CAP_MS})",
                "ours": round(default[f"heal_{length:g}"], 2),
                "baseline": round(capped[f"heal_{length:g}"], 2) if capped else None,
                "unit": "s",
            }
        )
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
