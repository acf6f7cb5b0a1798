"""Traces with the real engine (issue 39): ``vllm-omni serve`` on the tiny
model with ``--otlp-traces-endpoint`` exports over OTLP/HTTP to a receiver
on loopback. The ``vllm`` stage's endpoint reaches its engine's arguments,
and the stage hands its span to ``AsyncLLM.generate`` as ``trace_headers``:
vLLM's own ``llm_request`` span (exported by vLLM's tracer, in the stage's
process) is a child of the stage's span, in the client's trace. Both
placements: the stage in a process of its own, and in the server's process
(``in_process``, what ``vllm-omni serve MODEL`` runs), where vLLM's tracer
provider and ours live side by side."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.omni_server import OmniServer
from tests.otlp_receiver import (
    Receiver,
    TraceParent,
    post_chat,
    receiver,
    start_traced_server,
    tree,
)
from tests.real_engine.conftest import running_servers, write_tiny_pipeline

pytestmark = pytest.mark.timeout(600)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    yield from receiver()


@pytest.fixture(scope="module", params=["process", "in_process"])
def server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model: Path,
    collector: Receiver,
) -> Iterator[OmniServer]:
    directory = tmp_path_factory.mktemp(f"real-traces-{request.param}")
    in_process = request.param == "in_process"
    started = start_traced_server(
        directory,
        write_tiny_pipeline(directory, tiny_model, in_process=in_process),
        collector,
    )
    started.extra["process"] = "engine" if in_process else "stage-1"
    with running_servers({"traces": started}) as servers:
        yield servers["traces"]


def test_the_engine_span_joins_the_stage_span(
    server: OmniServer, collector: Receiver
) -> None:
    parent = TraceParent()
    response = post_chat(server, "hi", parent, timeout=120, max_tokens=4)
    assert response.status_code == 200, response.text
    spans = collector.wait_for(parent.trace_id, lambda spans: len(spans) >= 4)
    assert tree(spans, parent.span_id) == [
        (
            f"POST {CHAT}",
            [("stage guardrail", []), ("stage thinker", [("llm_request", [])])],
        )
    ]
    engine = next(span for span in spans if span.name == "llm_request")
    thinker = next(span for span in spans if span.name == "stage thinker")
    assert (
        engine.attributes["gen_ai.request.id"]
        == thinker.attributes["vllm_omni.request_id"]
    )
    assert engine.attributes["gen_ai.usage.completion_tokens"] >= 1
    assert thinker.resource["vllm_omni.process"] == server.extra["process"]
    assert engine.resource["vllm.process_id"] == str(thinker.resource["process.pid"])
