"""Every benchmark module takes ``--quick``: ``python -m benchmarks --quick``
(.ci/run) calls each ``run(quick=True)``, and ``bench_real_engine`` /
``bench_engine_metrics`` are run with ``--quick`` by .ci/real-engine. A
module without it would only be noticed at the end of a CI run."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import MODULES

ROOT = Path(__file__).resolve().parents[1]
# Run in the real-engine environment, by .ci/real-engine.
REAL_ENGINE = ("bench_real_engine", "bench_engine_metrics")


def _run_defaults(name: str) -> dict[str, object]:
    """``run``'s parameters with their defaults, read from the source (the
    modules import vLLM and their engines: seconds each)."""
    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    (run,) = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "run"
    ]
    args = run.args.args + run.args.kwonlyargs
    defaults = [None] * (len(run.args.args) - len(run.args.defaults))
    defaults += run.args.defaults + run.args.kw_defaults
    return {
        arg.arg: None if default is None else ast.literal_eval(default)
        for arg, default in zip(args, defaults, strict=True)
    }


@pytest.mark.parametrize("name", [*MODULES, *REAL_ENGINE])
def test_each_module_runs_quick(name: str) -> None:
    assert _run_defaults(name).get("quick", "missing") is False


@pytest.mark.parametrize("name", REAL_ENGINE)
def test_ci_runs_the_real_engine_modules_quick(name: str) -> None:
    assert f"benchmarks.{name} --quick" in (ROOT / ".ci" / "real-engine").read_text()


def test_every_benchmark_module_is_run_somewhere() -> None:
    helpers = {"__init__", "__main__", "paired", "breakdown", "http_marks"}
    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - helpers
    assert modules == set(MODULES) | set(REAL_ENGINE)


def test_quick_fails_when_a_correctness_row_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks --quick`` (CI) fails on a wrong correctness row,
    shown with a deliberately wrong expectation: a recall above 100 %."""
    from benchmarks import bench_sanitize
    from benchmarks.__main__ import main

    assert main(["--quick", "--only", "bench_sanitize"]) == 0
    monkeypatch.setattr(bench_sanitize, "_RECALL_GOAL", 100.5)
    assert main(["--quick", "--only", "bench_sanitize"]) == 1
    assert "correctness row failed: secret recall" in capsys.readouterr().err


def test_http_marks_cut_the_marks_into_requests() -> None:
    """Each request runs from its ``http.begin`` to its first ``sse.first``,
    each point at its first occurrence; a request without a chunk (a
    health check, the marks' own request) is left out."""
    from benchmarks.http_marks import windows

    marks = [
        ("http.begin", 10),
        ("asgi.enter", 12),
        ("engine.yield", 20),
        ("engine.yield", 25),  # a later output of the same request
        ("sse.first", 30),
        ("sse.first", 40),  # not the first chunk
        ("http.begin", 50),  # GET /health: no chunk
        ("asgi.enter", 51),
        ("http.begin", 60),
        ("sse.first", 70),
        ("asgi.enter", 65),  # marks arrive out of order from threads
    ]
    assert windows(marks) == [
        [
            ("http.begin", 10),
            ("asgi.enter", 12),
            ("engine.yield", 20),
            ("sse.first", 30),
        ],
        [("http.begin", 60), ("asgi.enter", 65), ("sse.first", 70)],
    ]


def test_http_marks_outermost_app_marks_and_serves_them() -> None:
    """The launcher's outermost ASGI app marks a request's entry, its
    response's start and its first body chunk, and answers ``GET
    /_omni_marks`` with the marks so far, forgetting them."""
    import asyncio

    import httpx

    from benchmarks import http_marks

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send(
            {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
        )
        await send({"type": "http.response.body", "body": b"data: 2\n\n"})

    async def scenario() -> tuple[list[Any], list[Any], str]:
        http_marks._marks.clear()
        transport = httpx.ASGITransport(app=http_marks._Outermost(app))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t"
        ) as client:
            text = (await client.get("/v1/completions")).text
            first = (await client.get(http_marks.PATH)).json()
            again = (await client.get(http_marks.PATH)).json()
        return first, again, text

    first, again, text = asyncio.run(scenario())
    assert text == "data: 1\n\ndata: 2\n\n"
    assert [point for point, _ in first] == [
        "asgi.enter",
        "response.start",
        "sse.write",
        "sse.first",
    ]
    assert [ns for _, ns in first] == sorted(ns for _, ns in first)
    assert again == []


def test_bench_http_breakdown_runs_every_layer() -> None:
    """``bench_http --breakdown`` (the success route's layers one at a time)
    is not part of ``--quick``: run it here, short, so a change to its
    helpers cannot leave it broken until somebody needs it."""
    import asyncio

    from benchmarks import bench_http

    rows = asyncio.run(bench_http.breakdown(rounds=2, profiled=2))
    assert [row["benchmark"] for row in rows] == [
        f"breakdown: {name}" for name, _, _ in bench_http.LAYERS
    ]
    assert all(float(row["ours"]) > 0 for row in rows)  # type: ignore[arg-type]
