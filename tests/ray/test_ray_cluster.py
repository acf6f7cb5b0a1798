"""``vllm-omni serve --worker-backend ray`` on a simulated multi-node cluster.

One ``ray.cluster_utils.Cluster`` per module (a head and two worker nodes,
all raylets on 127.0.0.1) and two real servers that join it with
``--ray-address``, started side by side. The main server's thinker, vocoder
and video stages are pinned to node A, its talker to node B by custom
resources; the second server (``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``) has a
guardrail on node A and its thinker on node B. The HTTP/SSE/WebSocket/job
subset of the e2e suite runs against the main server through the official
OpenAI SDK and a real websockets client, every client-visible output is
scanned for Ray addresses, node ids and tracebacks, and the request-time
drills stop (SIGSTOP) the talker actor's worker and then the cluster's GCS:
504/503 with the stage id, then recovery. The last test removes node B with
requests in flight on both servers: each gets a 500 naming the stage on B;
the main server exits 1, the keep-alive one stays up with ``/health`` 503.
The main server runs two API server processes (``--api-server-count 2``,
issue 46), the keep-alive one a single one.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import psutil
import pytest
import ray
import yaml
from ray.cluster_utils import Cluster
from websockets.sync.client import connect

from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.test_leaks import find_leaks, find_ray_leaks
from tests.ray.drills import FAST_FAILURE_DETECTION, FAST_PROBE, FAULTS, ping, stopped

# A drill: run after the main suite (``-m drill``, .ci/run).
pytestmark = [pytest.mark.timeout(180), pytest.mark.drill]

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
    "ray": FAST_PROBE,
}
# The keep-alive server: two actors, the thinker on the node that will go.
KEEP_ALIVE_PIPELINE: dict[str, Any] = {
    "model": "omni-ray-keep-alive",
    "stages": [
        {"id": 0, "name": "guardrail", "kind": "guardrail", "ray": ON_A},
        {"id": 1, "name": "thinker", "kind": "text", "timeout_s": 30, "ray": ON_B},
    ],
    "faults": [{"stage": 1, "marker": "@hang", "action": "hang"}],
    "ray": FAST_PROBE,
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
def servers(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, OmniServer]]:
    """The main server and the keep-alive one, started side by side."""
    started: dict[str, OmniServer] = {}
    try:
        # The main server runs two API server processes (issue 46): every
        # drill below holds for them; the keep-alive one runs one.
        for name, document, env, count in (
            ("main", PIPELINE, {}, "2"),
            (
                "alive",
                KEEP_ALIVE_PIPELINE,
                {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
                "1",
            ),
        ):
            directory = tmp_path_factory.mktemp(f"ray-cluster-{name}")
            pipeline = directory / "pipeline.yaml"
            pipeline.write_text(yaml.safe_dump(document))
            started[name] = start_server(
                directory,
                pipeline,
                env=env,
                extra_args=(
                    "--worker-backend",
                    "ray",
                    "--ray-address",
                    cluster.address,
                    "--api-server-count",
                    count,
                ),
            )
        for one in started.values():
            one.wait_ready(timeout=150)
        yield started
    finally:
        for one in started.values():
            one.stop()


@pytest.fixture(scope="module")
def server(servers: dict[str, OmniServer]) -> OmniServer:
    return servers["main"]


@pytest.fixture(scope="module")
def ray_driver(cluster: Cluster) -> Iterator[None]:
    """This process joins the cluster too, to reach the servers' actors."""
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def client(server: OmniServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _stage_processes(node: Any) -> list[psutil.Process]:
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    return [
        p
        for p in raylet.children(recursive=True)
        if " ".join(p.cmdline()).startswith("ray::_StageActor")
    ]


def test_stages_run_on_their_nodes(
    cluster: Cluster, servers: dict[str, OmniServer]
) -> None:
    # Main: thinker, vocoder, video on A, talker on B; keep-alive: guardrail
    # on A, thinker on B.
    assert len(_stage_processes(_node(cluster, "node_a"))) == 4
    assert len(_stage_processes(_node(cluster, "node_b"))) == 2


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
        (
            "t @novoice",
            ["text", "audio"],
            openai.NotFoundError,
            404,
            "NotFoundError",
            None,
            1,
        ),
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
            ["text", "audio"],
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
    # The stored error as an HTTP error: its retry guidance is the header.
    stored = {k: v for k, v in job["error"].items() if k != "retryable"}
    assert job["error"]["retryable"] is False
    assert content.status_code == 422 and content.json() == {"error": stored}
    assert content.headers["x-should-retry"] == "false"


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


def _stage_pid(server: OmniServer, stage_id: int) -> int:
    """The worker process of one of ``server``'s stage actors, asked of the
    actor itself (the server logs its actors' namespace)."""
    found = re.search(r"stage actors: Ray namespace (\S+)", server.log())
    assert found is not None
    return ping(ray.get_actor(f"omni-stage-{stage_id}", namespace=found[1]))


def _chat(client: openai.OpenAI, prompt: str, modalities: list[str]) -> Any:
    return client.chat.completions.create(
        model="omni-ray-cluster",
        messages=[{"role": "user", "content": prompt}],
        modalities=modalities,  # type: ignore[arg-type]
    )


def _refusal(client: openai.OpenAI, prompt: str, modalities: list[str]) -> Any:
    with pytest.raises(openai.APIStatusError) as caught:
        _chat(client, prompt, modalities)
    return caught.value


def _refused_stream(server: OmniServer, modalities: list[str]) -> httpx.Response:
    """A streamed chat refused before its first byte: a plain HTTP error."""
    with httpx.stream(
        "POST",
        server.base_url + CHAT,
        json={
            "messages": [{"role": "user", "content": "stream it"}],
            "modalities": modalities,
            "stream": True,
        },
        timeout=30,
    ) as response:
        response.read()
        return response


def _until_served(client: openai.OpenAI, modalities: list[str]) -> Any:
    """Retry as a client should, after each 503's Retry-After, for up to 15 s."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return _chat(client, "back again", modalities)
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(float(exc.response.headers["retry-after"]))


def _unavailable(response: httpx.Response, stage_id: int, message: str) -> str:
    """Check a 503 refusal; return what the client saw, for the leak scan."""
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["code"], error["type"], error["stage_id"], error["message"]) == (
        503,
        "ServiceUnavailableError",
        stage_id,
        message,
    )
    return response.text + json.dumps(dict(response.headers))


def test_a_stopped_stage_actor_is_504_in_flight_and_503_for_new_requests(
    cluster: Cluster, server: OmniServer, client: openai.OpenAI, ray_driver: None
) -> None:
    talker = _stage_pid(server, 1)
    in_flight: dict[str, Any] = {}
    streamed: dict[str, Any] = {}

    def call_sdk() -> None:
        try:
            in_flight["reply"] = _chat(client, "x @talkhang", ["text", "audio"])
        except openai.APIStatusError as exc:
            in_flight["error"] = exc

    threads = [
        threading.Thread(target=call_sdk),
        threading.Thread(
            target=lambda: streamed.update(
                zip(("status", "events"), _sse(server, "speak @talkhang"), strict=True)
            )
        ),
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # both are in the talker now (it hangs them)
    seen: list[str] = []
    with stopped(talker):
        for thread in threads:
            thread.join(timeout=15)
        refused = _refusal(client, "more", ["text", "audio"])
        refused_stream = _refused_stream(server, ["text", "audio"])
        # A request that does not need the silent stage is served.
        assert _chat(client, "only text", ["text"]).choices[0].message.content == (
            "You said: only text"
        )
    timed_out: openai.APIStatusError = in_flight["error"]
    assert timed_out.status_code == 504
    error = timed_out.response.json()["error"]
    assert (error["type"], error["stage_id"], error["message"]) == (
        "GatewayTimeoutError",
        1,
        "Stage 1 (talker) stopped answering.",
    )
    assert streamed["status"] == 200 and streamed["events"][-1] == "[DONE]"
    event = json.loads(streamed["events"][-2])["error"]
    assert (event["code"], event["type"], event["stage_id"]) == (
        504,
        "GatewayTimeoutError",
        1,
    )
    silent = "Stage 1 (talker) is not answering; retry later."
    seen.append(_unavailable(refused.response, 1, silent))
    seen.append(_unavailable(refused_stream, 1, silent))
    seen += [timed_out.response.text, "\n".join(streamed["events"])]
    spoken = _until_served(client, ["text", "audio"])
    assert spoken.choices[0].message.content == "You said: back again"
    node_ids = [n.node_id for n in [cluster.head_node, *cluster.worker_nodes]]
    assert [find_ray_leaks(text, cluster.address, node_ids) for text in seen] == [
        [] for _ in seen
    ]
    assert server.proc.poll() is None
    assert httpx.get(server.base_url + "/health").status_code == 200


def _until_refused(client: openai.OpenAI) -> openai.APIStatusError:
    """New requests until one is refused (the probe noticed), for up to 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            _chat(client, "still there?", ["text"])
        except openai.APIStatusError as exc:
            return exc
        time.sleep(0.1)
    raise AssertionError("no request was refused")


def test_an_unreachable_gcs_is_503_for_new_requests(
    cluster: Cluster, server: OmniServer, client: openai.OpenAI
) -> None:
    gcs = cluster.head_node.all_processes["gcs_server"][0].process.pid
    with stopped(gcs):
        refused = _until_refused(client)
        refused_stream = _refused_stream(server, ["text"])
    unreachable = "Stage 0 (thinker) cannot be reached; retry later."
    seen = [
        _unavailable(refused.response, 0, unreachable),
        _unavailable(refused_stream, 0, unreachable),
    ]
    reply = _until_served(client, ["text"])
    assert reply.choices[0].message.content == "You said: back again"
    node_ids = [n.node_id for n in [cluster.head_node, *cluster.worker_nodes]]
    assert [find_ray_leaks(text, cluster.address, node_ids) for text in seen] == [
        [],
        [],
    ]
    assert server.proc.poll() is None


def _post(server: OmniServer, body: dict[str, Any], sink: dict[str, Any]) -> None:
    sink["response"] = httpx.post(server.base_url + CHAT, json=body, timeout=60)
    sink["at"] = time.monotonic()


@pytest.mark.timeout(120)
def test_node_loss_fails_in_flight_requests_and_exits_or_keeps_alive(
    cluster: Cluster, servers: dict[str, OmniServer]
) -> None:
    """Last in the module: it kills both engines."""
    server, alive = servers["main"], servers["alive"]
    at_talker: dict[str, Any] = {}
    at_thinker: dict[str, Any] = {}
    at_alive: dict[str, Any] = {}
    streamed: dict[str, Any] = {}
    threads = [
        threading.Thread(
            target=_post,
            args=(
                alive,
                {"messages": [{"role": "user", "content": "x @hang"}]},
                at_alive,
            ),
        ),
        threading.Thread(
            target=_post,
            args=(
                server,
                {
                    "messages": [{"role": "user", "content": "x @talkhang"}],
                    "modalities": ["text", "audio"],
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
    # All four are in flight: two in the main talker, one in the main thinker,
    # one in the keep-alive thinker (on node B).
    time.sleep(1.5)
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
    _check_keep_alive(cluster, alive, at_alive["response"])
    assert server.proc.wait(timeout=30) == 1
    log = server.log()
    # Whichever noticed first: Ray (ActorDiedError) or the orphaned worker.
    assert "engine dead: stage 1 (talker) failed fatally: " in log
    assert "Ray" in log.split("engine dead")[1]
    last = max(at_talker["at"], at_thinker["at"])
    print(f"node loss to last in-flight failure: {last - removed:.2f} s")
    assert alive.proc.poll() is None


def _check_keep_alive(
    cluster: Cluster, alive: OmniServer, in_flight: httpx.Response
) -> None:
    """With VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: the in-flight request's 500 names
    the stage on the lost node, /health turns 503, a new request gets the
    canonical dead-engine error, and the server stays up."""
    dead = (500, "InternalServerError", 1, GENERIC)
    error = in_flight.json()["error"]
    assert (in_flight.status_code, error["type"], error["stage_id"]) == dead[:3]
    assert error["message"] == GENERIC
    deadline = time.monotonic() + 10
    while (health := httpx.get(alive.base_url + "/health")).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert health.json()["error"]["code"] == 503
    after = httpx.post(
        alive.base_url + CHAT,
        json={"messages": [{"role": "user", "content": "anyone?"}]},
        timeout=30,
    )
    error = after.json()["error"]
    assert (after.status_code, error["type"], error["stage_id"], error["message"]) == (
        dead
    )
    seen = in_flight.text + after.text + health.text
    assert find_ray_leaks(seen, cluster.address, []) == []
    log = alive.log()
    assert "engine dead: stage 1 (thinker) failed fatally: " in log
    assert "keeping the API server alive" in log
    assert alive.proc.poll() is None
