"""Traces on the Ray backend (issue 39): ``vllm-omni serve --worker-backend
ray`` with its own local Ray instance exports over OTLP/HTTP to a receiver
on loopback; every stage runs in a Ray actor, whose span joins the request's
trace through the context the submission carried, and a stage's failure is
recorded on the actor's span as in a stage process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.omni_server import (
    FAULTS,
    REFERENCE_STAGES,
    OmniServer,
    write_pipeline,
)
from tests.otlp_receiver import (
    Receiver,
    TraceParent,
    post_chat,
    receiver,
    start_traced_server,
    tree,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    yield from receiver()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, collector: Receiver
) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp("ray-traces")
    started = start_traced_server(
        directory,
        # The chat's stages only: every stage kind starts as a Ray actor
        # through ``serve`` in the Ray soak and the Ray cluster drills (CI).
        write_pipeline(
            directory,
            stages=REFERENCE_STAGES[:2],
            faults=[f for f in FAULTS if f["stage"] in (0, 1)],
        ),
        collector,
        extra_args=("--worker-backend", "ray"),
    )
    try:
        started.wait_ready(timeout=280)
        yield started
    finally:
        started.stop()


@pytest.mark.parametrize(("content", "status"), [("hello", 200), ("@boom", 500)])
def test_a_ray_request_is_one_trace_with_the_actors_spans(
    server: OmniServer, collector: Receiver, content: str, status: int
) -> None:
    parent = TraceParent()
    response = post_chat(server, content, parent, timeout=60)
    assert response.status_code == status
    spans = collector.wait_for(parent.trace_id, lambda spans: len(spans) >= 3)
    assert tree(spans, parent.span_id) == [
        (f"POST {CHAT}", [("stage guardrail", []), ("stage thinker", [])])
    ]
    by_name = {span.name: span for span in spans}
    # Every stage in an actor of its own (no stage runs in the server's
    # process on Ray), each exporting from there.
    assert by_name["stage guardrail"].resource["vllm_omni.process"] == "stage-0"
    thinker = by_name["stage thinker"]
    assert thinker.resource["vllm_omni.process"] == "stage-1"
    assert (
        thinker.resource["process.pid"]
        != by_name[f"POST {CHAT}"].resource["process.pid"]
    )
    if status == 200:
        assert thinker.status == "UNSET"
        assert "error.type" not in thinker.attributes
        return
    error = response.json()["error"]
    for span in (thinker, by_name[f"POST {CHAT}"]):
        assert span.status == "ERROR"
        assert span.attributes["error.type"] == error["type"]
        assert span.attributes["vllm_omni.status_code"] == error["code"]
        assert span.attributes["vllm_omni.stage_id"] == error["stage_id"] == 1
