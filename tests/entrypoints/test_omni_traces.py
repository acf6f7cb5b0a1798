"""Traces of Python callers (issue 39): ``Omni(otlp_traces_endpoint=...)``
exports over OTLP/HTTP to a receiver on loopback, and
``generate(trace_headers=...)`` joins the caller's trace: one root span per
request (``generate``, no traced request calling it), the stages' spans
under it, the record of a failure on it and on the failing stage's span. In
a process of its own: tracing stays on for the rest of a process's life."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.omni_server import write_pipeline
from tests.otlp_receiver import TRACE_ENV, Receiver, TraceParent, receiver, tree

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from vllm_omni.entrypoints.omni import Omni

if __name__ == "__main__":
    pipeline, endpoint, ok, failing = sys.argv[1:]
    with Omni(pipeline=pipeline, otlp_traces_endpoint=endpoint) as omni:
        quiet = {"use_tqdm": False}
        omni.generate("hello", trace_headers={"traceparent": ok}, **quiet)
        try:
            omni.generate("@boom", trace_headers={"traceparent": failing}, **quiet)
        except Exception as exc:
            print(json.dumps(exc.details.to_wire()))
"""


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    yield from receiver()


def test_an_offline_request_joins_the_callers_trace(
    tmp_path: Path, collector: Receiver
) -> None:
    ok, failing = TraceParent(), TraceParent()
    script = tmp_path / "offline.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(write_pipeline(tmp_path)),
            collector.endpoint,
            ok.headers["traceparent"],
            failing.headers["traceparent"],
        ],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            **TRACE_ENV,
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    for parent in (ok, failing):
        spans = collector.wait_for(parent.trace_id, lambda spans: len(spans) >= 3)
        assert tree(spans, parent.span_id) == [
            ("generate", [("stage guardrail", []), ("stage thinker", [])])
        ]
    spans = collector.trace(failing.trace_id)
    for name in ("generate", "stage thinker"):
        (span,) = [s for s in spans if s.name == name]
        assert span.status == "ERROR"
        assert span.attributes["error.type"] == record["error_type"]
        assert span.attributes["vllm_omni.stage_id"] == record["stage_id"] == 1
    (root,) = [s for s in collector.trace(ok.trace_id) if s.name == "generate"]
    assert root.status == "UNSET" and root.kind == "SERVER"
