"""Every benchmark module takes ``--quick``: ``python -m benchmarks --quick``
(.ci/run) calls each ``run(quick=True)``, and ``bench_real_engine`` /
``bench_engine_metrics`` are run with ``--quick`` by .ci/real-engine. A
module without it would only be noticed at the end of a CI run."""

from __future__ import annotations

import ast
from pathlib import Path

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
