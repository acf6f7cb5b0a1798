"""The stages' ``vllm:*`` families on this process's registry (``stage_metrics``).

A forked child stands for a stage process: it imported prometheus_client
before the fork (as a launcher's fork has), calls ``keep_in`` and creates
metrics the way vLLM's stat logger does (its multiprocess modes). What the
collector reads back from those files is scraped as Prometheus text and
parsed with ``prometheus_client.parser``. The real engine's families are
checked against upstream's own server in ``tests/real_engine``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.engines import collect, write_pipeline
from tests.prom import local_text
from vllm_omni.engine.stage_metrics import (
    STAGE_METRICS,
    StageDirectories,
    StageMetricsCollector,
    keep_in,
)
from vllm_omni.entrypoints.async_omni import AsyncOmni

LABELS = ["model_name", "engine"]


def _as_a_stage(directory: str, body: Callable[[], None]) -> None:
    """Run ``body`` in a forked child that keeps its metrics in ``directory``."""

    def child() -> None:
        keep_in(directory)
        body()

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0


def _engine_metrics() -> None:
    """What a vllm stage's stat logger creates (its kinds and modes)."""
    registry = CollectorRegistry()
    running = Gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        LABELS,
        multiprocess_mode="mostrecent",
        registry=registry,
    )
    running.labels("tiny", "0").set(3)
    success = Counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [*LABELS, "finished_reason"],
        registry=registry,
    )
    success.labels("tiny", "0", "length").inc(5)
    success.labels("tiny", "0", "stop").inc(2)
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        LABELS,
        buckets=[0.1, 1.0],
        registry=registry,
    )
    ttft.labels("tiny", "0").observe(0.05)
    ttft.labels("tiny", "0").observe(0.5)
    # Not vLLM's: stays in the stage.
    Counter("omni_private", "A stage's own counter.", registry=registry).inc()


def _kv_fetch_gauge() -> None:
    """vLLM's one family with a ``stage`` label of its own (a KV consumer)."""
    gauge = Gauge(
        "vllm:num_requests_kv_fetch_by_stage",
        "Number of waiting requests by async KV load stage.",
        [*LABELS, "stage"],
        multiprocess_mode="mostrecent",
        registry=CollectorRegistry(),
    )
    gauge.labels("tiny", "0", "in_progress").set(1)


@pytest.fixture
def stages(tmp_path: Path) -> Iterator[tuple[StageDirectories, dict[int, bool]]]:
    """Two stages' directories and whether each runs (a test flips it)."""
    directories = StageDirectories(str(tmp_path))
    running = {1: True, 3: True}
    for stage_id in running:
        directories.add(stage_id, lambda stage_id=stage_id: running[stage_id])
    yield directories, running


def _scrape(collector: StageMetricsCollector) -> dict[str, object]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _samples(family: object) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for s in family.samples  # type: ignore[attr-defined]
    }


def test_a_stage_families_cross_with_upstream_definitions_and_a_stage_label(
    stages: tuple[StageDirectories, dict[int, bool]],
) -> None:
    directories, _ = stages
    _as_a_stage(directories.directory(1), _engine_metrics)
    collector = StageMetricsCollector()
    collector.add(directories)
    families = _scrape(collector)

    assert set(families) == {
        "vllm:num_requests_running",
        "vllm:request_success",
        "vllm:time_to_first_token_seconds",
    }
    kinds = {name: (f.type, f.documentation) for name, f in families.items()}  # type: ignore[attr-defined]
    assert kinds == {
        "vllm:num_requests_running": (
            "gauge",
            "Number of requests in model execution batches.",
        ),
        "vllm:request_success": (
            "counter",
            "Count of successfully processed requests.",
        ),
        "vllm:time_to_first_token_seconds": (
            "histogram",
            "Histogram of time to first token in seconds.",
        ),
    }
    base = {("model_name", "tiny"), ("engine", "0"), ("stage", "1")}
    success = "vllm:request_success_total"
    assert _samples(families["vllm:request_success"]) == {
        (success, frozenset({*base, ("finished_reason", "length")})): 5.0,
        (success, frozenset({*base, ("finished_reason", "stop")})): 2.0,
    }
    assert _samples(families["vllm:num_requests_running"]) == {
        ("vllm:num_requests_running", frozenset(base)): 3.0
    }
    ttft = _samples(families["vllm:time_to_first_token_seconds"])
    assert ttft[("vllm:time_to_first_token_seconds_count", frozenset(base))] == 2.0
    assert (
        ttft[
            (
                "vllm:time_to_first_token_seconds_bucket",
                frozenset({*base, ("le", "0.1")}),
            )
        ]
        == 1.0
    )


def test_a_stopped_stage_keeps_its_counters_and_loses_its_gauges(
    stages: tuple[StageDirectories, dict[int, bool]],
) -> None:
    directories, running = stages
    for stage_id in running:
        _as_a_stage(directories.directory(stage_id), _engine_metrics)
    collector = StageMetricsCollector()
    collector.add(directories)
    running[3] = False

    families = _scrape(collector)
    gauge = families["vllm:num_requests_running"]
    assert {s.labels["stage"] for s in gauge.samples} == {"1"}  # type: ignore[attr-defined]
    success = families["vllm:request_success"]
    totals = {
        s.labels["stage"]: s.value
        for s in success.samples  # type: ignore[attr-defined]
        if s.labels["finished_reason"] == "length"
    }
    assert totals == {"1": 5.0, "3": 5.0}


def test_a_stage_label_of_upstream_is_kept_as_exported_stage(
    stages: tuple[StageDirectories, dict[int, bool]],
) -> None:
    directories, _ = stages
    _as_a_stage(directories.directory(3), _kv_fetch_gauge)
    collector = StageMetricsCollector()
    collector.add(directories)
    family = _scrape(collector)["vllm:num_requests_kv_fetch_by_stage"]
    assert _samples(family) == {
        (
            "vllm:num_requests_kv_fetch_by_stage",
            frozenset(
                {
                    ("model_name", "tiny"),
                    ("engine", "0"),
                    ("exported_stage", "in_progress"),
                    ("stage", "3"),
                }
            ),
        ): 1.0
    }


def test_a_removed_source_and_removed_files_leave_the_scrape(
    stages: tuple[StageDirectories, dict[int, bool]],
) -> None:
    directories, _ = stages
    _as_a_stage(directories.directory(1), _engine_metrics)
    collector = StageMetricsCollector()
    collector.add(directories)
    assert _scrape(collector)
    for name in os.listdir(directories.directory(1)):
        os.remove(os.path.join(directories.directory(1), name))
    assert _scrape(collector) == {}
    _as_a_stage(directories.directory(1), _engine_metrics)
    collector.remove(directories)
    assert _scrape(collector) == {}


async def test_reference_stages_export_nothing_and_leave_no_files(
    tmp_path: Path,
) -> None:
    pipeline = write_pipeline(
        tmp_path,
        {
            "model": "omni-metrics",
            "stages": [
                {"id": 0, "name": "guardrail", "kind": "guardrail"},
                {"id": 1, "name": "thinker", "kind": "text"},
            ],
        },
    )
    others = list(STAGE_METRICS._sources)  # the session's other engines
    engine = await AsyncOmni.create(pipeline=str(pipeline))
    try:
        await collect(engine, "hello", request_id="metrics-1")
        (directories,) = [s for s in STAGE_METRICS._sources if s not in others]
        assert isinstance(directories, StageDirectories)
        root = directories.root
        # Every stage process was given its directory, in this engine's
        # root; the guardrail runs in this process (engine.inline): none.
        assert sorted(os.listdir(root)) == ["stage-1"]
        names = {f.name for f in text_string_to_metric_families(local_text())}
        assert not {name for name in names if name.startswith("vllm:")}
    finally:
        engine.shutdown()
    assert not os.path.exists(root)
    assert STAGE_METRICS._sources == others
