"""``vllm-omni serve --worker-backend ray`` on a simulated multi-node cluster.

One ``ray.cluster_utils.Cluster`` per module (a head and two worker nodes,
all raylets on 127.0.0.1) and one real server that joins it with
``--ray-address``. The thinker, vocoder and video stages are pinned to node
A, the talker to node B by custom resources. The HTTP/SSE/WebSocket/job
subset of the e2e suite runs against it through the official OpenAI SDK and
a real websockets client, every client-visible output is scanned for Ray
addresses, node ids and tracebacks, and the last test removes node B with
requests in flight: each gets a 500 naming the talker's stage id, and the
server exits 1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml
from ray.cluster_utils import Cluster
from websockets.sync.client import connect

from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.test_leaks import find_leaks, find_ray_leaks
from tests.ray.drills import FAST_FAILURE_DETECTION, FAULTS

pytestmark = pytest.mark.timeout(180)

GENERIC = "The server had an error while processing your request."
CHAT = "/v1/chat/completions"
ON_A = {"resources": {"node_a": 1}}
ON_B = {"resources": {"node_b": 1}}
PIPELINE: dict[str, Any] = {
    "model": "omni-ray-cluster",
    "stages": [
        {"id": 0, "name": "thinker", "kind": "text", "timeout_s": 30, "ray": ON_A},
        {"id": 1, "name": "talker", "kind": "talker", "timeout_s": 30, "ray": ON_B},
        {"id": 2, "name": "vocoder", "kind": "vocoder", "timeout_s": 30, "ray": ON_A},
        {"id": 3, "name": "video", "kind": "video", "timeout_s": 30, "ray": ON_A},
    ],
    "faults": [
        *FAULTS,
        {
            "stage": 3,
            "marker": "@vfail",
            "action": "raise",
            "exception": "vllm.exceptions:VLLMUnprocessableEntityError",
            "args": ["cannot render /home/alice/clip.mp4"],
            "kwargs": {"parameter": "prompt"},
        },
    ],
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "_system_config": FAST_FAILURE_DETECTION,
        },
    )
    try:
        cluster.add_node(num_cpus=1, resources={"node_a": 10})
        cluster.add_node(num_cpus=1, resources={"node_b": 10})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _node(cluster: Cluster, resource: str) -> Any:
    return next(n for n in cluster.worker_nodes if resource in n._ray_params.resources)


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("ray-cluster")
    pipeline = directory / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(PIPELINE))
    started = start_server(
        directory,
        pipeline,
        extra_args=("--worker-backend", "ray", "--ray-address", cluster.address),
    )
    try:
        started.wait_ready(timeout=150)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def client(server: OmniServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _stage_processes(node: Any) -> list[psutil.Process]:
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    return [
        p
        for p in raylet.children(recursive=True)
        if " ".join(p.cmdline()).startswith("ray::_StageActor.run")
    ]


def test_stages_run_on_their_nodes(cluster: Cluster, server: OmniServer) -> None:
    assert len(_stage_processes(_node(cluster, "node_a"))) == 3
    assert len(_stage_processes(_node(cluster, "node_b"))) == 1


def test_chat_and_speech_cross_nodes(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="omni-ray-cluster",
        messages=[{"role": "user", "content": "hello cluster"}],
    )
    assert reply.choices[0].message.content == "You said: hello cluster"
    spoken = client.chat.completions.create(
        model="omni-ray-cluster",
        messages=[{"role": "user", "content": "say it"}],
        modalities=["text", "audio"],
    )
    assert spoken.choices[0].message.content == "You said: say it"


@pytest.mark.parametrize(
    ("prompt", "modalities", "cls", "status", "error_type", "param", "stage_id"),
    [
        (
            "t @invalid",
            ["text"],
            openai.BadRequestError,
            400,
            "BadRequestError",
            "temperature",
            0,
        ),
        ("t @novoice", ["audio"], openai.NotFoundError, 404, "NotFoundError", None, 1),
        (
            "t @boom",
            ["text"],
            openai.InternalServerError,
            500,
            "InternalServerError",
            None,
            0,
        ),
        (
            "t @unavailable",
            ["audio"],
            openai.InternalServerError,
            503,
            "ServiceUnavailableError",
            None,
            1,
        ),
    ],
)
def test_stage_errors_over_http(
    client: openai.OpenAI,
    prompt: str,
    modalities: list[str],
    cls: type[openai.APIStatusError],
    status: int,
    error_type: str,
    param: str | None,
    stage_id: int,
) -> None:
    with pytest.raises(cls) as caught:
        client.chat.completions.create(
            model="omni-ray-cluster",
            messages=[{"role": "user", "content": prompt}],
            modalities=modalities,  # type: ignore[arg-type]
        )
    error = caught.value.response.json()["error"]
    assert caught.value.status_code == status == error["code"]
    assert (error["type"], error["param"], error["stage_id"]) == (
        error_type,
        param,
        stage_id,
    )
    if status == 500:
        assert error["message"] == GENERIC


def _sse(server: OmniServer, prompt: str) -> tuple[int, list[str]]:
    with httpx.stream(
        "POST",
        server.base_url + CHAT,
        json={
            "messages": [{"role": "user", "content": prompt}],
            "modalities": ["text", "audio"],
            "stream": True,
        },
        timeout=60,
    ) as response:
        events = [
            line[len("data: ") :]
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
        return response.status_code, events


def test_sse_error_after_first_byte(server: OmniServer) -> None:
    status, events = _sse(server, "stream @unavailable")
    assert status == 200
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["code"], error["type"], error["stage_id"]) == (
        503,
        "ServiceUnavailableError",
        1,
    )


def _websocket(server: OmniServer) -> list[str]:
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    frames: list[str] = []
    with connect(url, open_timeout=10) as ws:
        frames.append(str(ws.recv(timeout=10)))
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "event_id": "ray-1",
                    "response": {"instructions": "x @boom"},
                }
            )
        )
        while True:
            frames.append(str(ws.recv(timeout=30)))
            if json.loads(frames[-1])["type"] == "error":
                break
    return frames


def test_websocket_error_event(server: OmniServer) -> None:
    frames = _websocket(server)
    error = json.loads(frames[-1])
    assert error["event_id"] == "ray-1"
    assert error["error"]["code"] == 500 and error["error"]["stage_id"] == 0
    assert error["error"]["message"] == GENERIC


def _failed_job(server: OmniServer) -> tuple[dict[str, Any], httpx.Response]:
    created = httpx.post(
        server.base_url + "/v1/videos",
        json={"prompt": "clip @vfail", "seconds": "1"},
        timeout=30,
    )
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        job = httpx.get(f"{server.base_url}/v1/videos/{job_id}").json()
        if job["status"] in ("completed", "failed"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    content = httpx.get(f"{server.base_url}/v1/videos/{job_id}/content")
    return job, content


def test_failed_job_stores_the_stage_record(server: OmniServer) -> None:
    job, content = _failed_job(server)
    assert job["status"] == "failed"
    assert (job["error"]["code"], job["error"]["param"], job["error"]["stage_id"]) == (
        422,
        "prompt",
        3,
    )
    assert content.status_code == 422 and content.json() == {"error": job["error"]}


def test_nothing_of_ray_reaches_a_client(cluster: Cluster, server: OmniServer) -> None:
    outputs: dict[str, str] = {}
    for prompt in ("t @boom", "t @secret", "t @invalid"):
        response = httpx.post(
            server.base_url + CHAT,
            json={"messages": [{"role": "user", "content": prompt}]},
            timeout=30,
        )
        outputs[prompt] = response.text + json.dumps(dict(response.headers))
    outputs["sse"] = "\n".join(_sse(server, "stream @unavailable")[1])
    outputs["websocket"] = "\n".join(_websocket(server))
    job, content = _failed_job(server)
    outputs["job"] = json.dumps(job) + content.text
    outputs["metrics"] = httpx.get(server.base_url + "/metrics").text
    node_ids = [n.node_id for n in [cluster.head_node, *cluster.worker_nodes]]
    leaks = {
        where: find_leaks(text) + find_ray_leaks(text, cluster.address, node_ids)
        for where, text in outputs.items()
    }
    assert leaks == {where: [] for where in outputs}


def _post(server: OmniServer, body: dict[str, Any], sink: dict[str, Any]) -> None:
    sink["response"] = httpx.post(server.base_url + CHAT, json=body, timeout=60)
    sink["at"] = time.monotonic()


@pytest.mark.timeout(120)
def test_node_loss_fails_in_flight_requests_and_exits(
    cluster: Cluster, server: OmniServer
) -> None:
    """Last in the module: it kills the engine."""
    at_talker: dict[str, Any] = {}
    at_thinker: dict[str, Any] = {}
    streamed: dict[str, Any] = {}
    threads = [
        threading.Thread(
            target=_post,
            args=(
                server,
                {
                    "messages": [{"role": "user", "content": "x @talkhang"}],
                    "modalities": ["audio"],
                },
                at_talker,
            ),
        ),
        threading.Thread(
            target=_post,
            args=(
                server,
                {"messages": [{"role": "user", "content": "x @hang"}]},
                at_thinker,
            ),
        ),
        threading.Thread(
            target=lambda: streamed.update(
                zip(("status", "events"), _sse(server, "speak @talkhang"), strict=True)
            )
        ),
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # all three are in flight: two in the talker, one in the thinker
    assert all(thread.is_alive() for thread in threads)
    removed = time.monotonic()
    cluster.remove_node(_node(cluster, "node_b"), allow_graceful=False)
    for thread in threads:
        thread.join(timeout=60)
    for sink in (at_talker, at_thinker):
        response: httpx.Response = sink["response"]
        assert response.status_code == 500
        error = response.json()["error"]
        assert (error["type"], error["stage_id"], error["message"]) == (
            "InternalServerError",
            1,
            GENERIC,
        )
        assert find_ray_leaks(response.text, cluster.address, []) == []
    assert streamed["status"] == 200
    assert streamed["events"][-1] == "[DONE]"
    error = json.loads(streamed["events"][-2])["error"]
    assert (error["code"], error["stage_id"]) == (500, 1)
    assert server.proc.wait(timeout=30) == 1
    log = server.log()
    # Whichever noticed first: Ray (ActorDiedError) or the orphaned worker.
    assert "engine dead: stage 1 (talker) failed fatally: " in log
    assert "Ray" in log.split("engine dead")[1]
    last = max(at_talker["at"], at_thinker["at"])
    print(f"node loss to last in-flight failure: {last - removed:.2f} s")
