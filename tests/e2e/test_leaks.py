"""Nothing private leaks, on any transport.

Stage faults raise *explicit* semantic errors (whose text is public) carrying
a traceback, paths, tokens, keys, a password, URL credentials, a data URI and
a memory address; a validation error also carries a rejected value. They are
pushed through HTTP, SSE, WebSocket and an async job, then every public
output — bodies, headers, stream events, the job store's bytes on disk, the
server's INFO log lines and the metric labels — is scanned for them.

``find_ray_leaks`` adds what the Ray worker backend must hide (Ray's remote
tracebacks, actor titles, node ids, the cluster address); the real scan of a
Ray-backed server runs in ``tests/ray/test_ray_cluster.py``, which owns the
cluster. ``find_host_leaks`` adds where the stages run: host addresses and
the stage wire's ``tcp://``/``ipc://`` endpoints; the partition drills
(``tests/e2e/test_partitions.py``, ``tests/ray/test_ray_partitions.py``),
whose stages run on other network-namespace hosts, scan everything their
clients saw with all three, and this module's scan adds it for the
server's own stage socket.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.e2e.omni_server import LEAK_SECRETS, OmniServer

CHAT = "/v1/chat/completions"


def find_leaks(text: str) -> list[str]:
    """The private strings present in ``text``."""
    return [secret for secret in LEAK_SECRETS if secret in text]


# What the Ray backend must never show a client: Ray's remote traceback and
# its exception names, actor and process titles, ids and the cluster address.
RAY_MARKERS: tuple[str, ...] = (
    "ray::",
    "RayTaskError",
    "ActorDiedError",
    "ActorUnavailableError",
    "actor_id",
    "node_id",
    "ip=",
    "_StageActor",
    # The request-time probe's failures (a stopped actor or GCS).
    "GetTimeoutError",
    "RpcError",
    "Deadline Exceeded",
    "GCS",
    "gcs_server",
)


def find_ray_leaks(text: str, cluster_address: str, node_ids: list[str]) -> list[str]:
    """The Ray internals present in ``text`` (``tests/ray`` scans with this)."""
    private = (*RAY_MARKERS, cluster_address, *node_ids)
    return [secret for secret in private if secret and secret in text]


# An IPv4 address; a client-visible text has no business holding one.
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")


def find_host_leaks(text: str, addresses: Iterable[str] = ()) -> list[str]:
    """Where stages run, present in ``text``: the given host addresses, any
    IPv4 address, and the stage wire's endpoint schemes."""
    found = [a for a in addresses if a and a in text]
    found += [scheme for scheme in ("tcp://", "ipc://") if scheme in text]
    found += [match for match in _IPV4.findall(text) if match not in found]
    return found


def _http(server: OmniServer) -> str:
    response = httpx.post(
        server.base_url + CHAT,
        headers=server.headers(),
        json={"messages": [{"role": "user", "content": "x @leakclient"}]},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"
    # The message did travel, sanitized: the probe is not vacuous.
    assert (
        "failed for <path> with token <redacted>" in response.json()["error"]["message"]
    )
    return response.text + json.dumps(dict(response.headers))


def _sse(server: OmniServer) -> str:
    with httpx.stream(
        "POST",
        server.base_url + CHAT,
        headers=server.headers(),
        json={
            "messages": [{"role": "user", "content": "talk @leaktalk"}],
            "modalities": ["text", "audio"],
            "stream": True,
        },
        timeout=30,
    ) as response:
        assert response.status_code == 200
        text = "\n".join(response.iter_lines())
    assert '"code":503' in text.replace(" ", "")
    return text


def _websocket(server: OmniServer) -> str:
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    frames: list[str] = []
    with connect(url, additional_headers=server.headers(), open_timeout=10) as ws:
        frames.append(str(ws.recv(timeout=10)))
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "event_id": "leak-1",
                    "response": {"instructions": "x @leakclient"},
                }
            )
        )
        try:
            while True:
                frames.append(str(ws.recv(timeout=10)))
        except Exception:  # the server closes after the terminal error event
            pass
    assert any('"type": "error"' in f or '"type":"error"' in f for f in frames)
    return "\n".join(frames)


def _job(server: OmniServer) -> str:
    created = httpx.post(
        server.base_url + "/v1/videos",
        headers=server.headers(),
        json={"prompt": "clip @vleak", "seconds": "1"},
        timeout=30,
    )
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 30
    while True:
        job = httpx.get(
            f"{server.base_url}/v1/videos/{job_id}", headers=server.headers()
        ).json()
        if job["status"] in ("completed", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert job["status"] == "failed"
    assert job["error"]["code"] == 422
    content = httpx.get(
        f"{server.base_url}/v1/videos/{job_id}/content", headers=server.headers()
    )
    assert content.status_code == 422
    return json.dumps(job) + content.text


def _job_store_bytes(server: OmniServer) -> str:
    directory = server.log_path.parent
    blobs = [p.read_bytes() for p in directory.rglob("*") if "jobs" in p.name]
    assert blobs, "the job store must exist on disk"
    return b"\n".join(blobs).decode("latin-1")


def _info_log_lines(server: OmniServer) -> str:
    lines = server.log().splitlines()
    return "\n".join(line for line in lines if " INFO " in line or "INFO:" in line)


@pytest.mark.timeout(120)
def test_no_transport_leaks(omni_server: OmniServer) -> None:
    outputs = {
        "http": _http(omni_server),
        "sse": _sse(omni_server),
        "websocket": _websocket(omni_server),
        "job": _job(omni_server),
    }
    outputs["job store on disk"] = _job_store_bytes(omni_server)
    outputs["INFO log"] = _info_log_lines(omni_server)
    outputs["metrics"] = httpx.get(omni_server.base_url + "/metrics").text
    leaks = {where: find_leaks(text) for where, text in outputs.items()}
    assert leaks == {where: [] for where in outputs}
    # What only the operator may know: where the stages listen. (The INFO
    # log names the listening address; it is not client-visible.)
    visible = {k: v for k, v in outputs.items() if k not in _SERVER_SIDE}
    hosts = {where: find_host_leaks(text) for where, text in visible.items()}
    assert hosts == {where: [] for where in visible}


_SERVER_SIDE = ("job store on disk", "INFO log")


def test_planted_leak_is_found(tmp_path: Path) -> None:
    """The scanner is not blind: a body that echoes raw exception text is caught."""
    planted = json.dumps(
        {"error": {"message": "open /home/alice/x failed", "code": 400}}
    )
    assert find_leaks(planted) == ["/home/alice"]
    log = tmp_path / "server.log"
    log.write_text("2026 INFO x: token hf_LEAKLEAKLEAK42\n")
    assert find_leaks(log.read_text()) == ["hf_LEAKLEAKLEAK42"]


def test_planted_ray_leak_is_found() -> None:
    """A body echoing a Ray task error is caught: its name, actor title, node
    id and the cluster address."""
    node = "9f2c" * 14
    planted = json.dumps(
        {
            "error": {
                "message": "ray::_StageActor.run() (pid=1, ip=10.0.0.7, "
                f"actor_id=ab12) RayTaskError on {node} via 10.0.0.7:6379"
            }
        }
    )
    assert find_ray_leaks(planted, "10.0.0.7:6379", [node]) == [
        "ray::",
        "RayTaskError",
        "actor_id",
        "ip=",
        "_StageActor",
        "10.0.0.7:6379",
        node,
    ]


def test_planted_ray_probe_leak_is_found() -> None:
    """A body echoing the request-time probe's failures is caught: the
    timed-out ping and the GCS call that missed its deadline."""
    planted = json.dumps(
        {
            "error": {
                "message": "GetTimeoutError: Get timed out; RpcError: RPC error: "
                "Deadline Exceeded (GCS at 10.0.0.7:6379, gcs_server)"
            }
        }
    )
    assert find_ray_leaks(planted, "10.0.0.7:6379", []) == [
        "GetTimeoutError",
        "RpcError",
        "Deadline Exceeded",
        "GCS",
        "gcs_server",
        "10.0.0.7:6379",
    ]


def test_planted_host_leak_is_found() -> None:
    """A body naming where a stage runs is caught: the stage host's address,
    the wire's endpoint and any other address."""
    planted = json.dumps(
        {
            "error": {
                "message": "stage 1 at tcp://10.213.7.2:5555 unreachable "
                "(ipc:///tmp/vllm-omni-x/stages.sock, via 192.168.1.4)"
            }
        }
    )
    assert find_host_leaks(planted, ["10.213.7.2"]) == [
        "10.213.7.2",
        "tcp://",
        "ipc://",
        "192.168.1.4",
    ]
