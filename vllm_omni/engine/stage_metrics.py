"""The engines' own ``vllm:*`` metrics, brought from the stages to this process.

A ``vllm`` stage's ``AsyncLLM`` records vLLM's metrics (its Prometheus stat
logger: ``vllm:num_requests_running``, ``vllm:request_success_total``,
``vllm:time_to_first_token_seconds`` ...) in the stage's process, not in the
server's. This module puts them on this process's default registry, which
the server's ``/metrics`` exposes: every family exactly as the stage's
engine defines it (name, type, help, labels; nothing is redefined here),
each sample with one more label, ``stage`` (the stage id), so two ``vllm``
stages never collide. Only families named ``vllm:`` cross: a stage's other
metrics stay in it, and a reference stage, which is not vLLM, exports none.

How the samples travel, per backend:

- a local stage process (``multi_process``) keeps every metric it creates
  in prometheus_client's multiprocess files, in a directory of its own
  (``keep_in``, called before the stage is built): the mechanism vLLM uses
  when several API-server processes share one endpoint. The engine's
  process reads them at scrape time (``StageDirectories``), so a scrape
  costs no call to the stage and sees what the stage wrote last;
- a Ray stage actor may run on another host: it keeps its metrics in its own
  registry, and the engine's process asks every actor for its ``vllm:``
  families at scrape time (``engine_families`` in the actor; the source is
  the Ray launcher's).

A stage that no longer runs keeps its counters and histograms (a dead
process's files stay, as in prometheus_client's multiprocess mode), and its
gauges are removed: a dead engine has no requests running, no KV cache in
use, so no frozen last value is shown as if it were current. A stage is
never restarted within an engine (its death is the engine's); a new engine
(a restarted server) starts from an empty directory, so its counters start
at zero, as after a restart of ``vllm serve``, which ``rate`` and
``increase`` read as a counter reset.

A family whose samples already carry a ``stage`` label (vLLM's
``vllm:num_requests_kv_fetch_by_stage``, on a KV consumer) keeps that value
as ``exported_stage``: Prometheus' own rule for a target label that collides
with a scraped one.

This module must not define or copy a metric, and must not decide anything
about requests: it moves samples.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import REGISTRY, values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

__all__ = [
    "ENGINE_PREFIX",
    "STAGE_LABEL",
    "STAGE_METRICS",
    "StageDirectories",
    "StageMetricsCollector",
    "StageMetricsSource",
    "engine_families",
    "keep_in",
    "without_gauges",
]

ENGINE_PREFIX = "vllm:"
STAGE_LABEL = "stage"
# Prometheus' name for a scraped label that collides with a target label.
_EXPORTED_STAGE_LABEL = "exported_" + STAGE_LABEL
# prometheus_client reads its multiprocess directory from this variable.
_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def keep_in(directory: str) -> None:
    """Keep every metric this process creates from now on in
    prometheus_client's multiprocess files under ``directory``.

    Call it in a stage process before its engine exists. prometheus_client
    picks its value class from ``PROMETHEUS_MULTIPROC_DIR`` once, at import,
    and a stage process is a fork of a launcher that imported it already:
    the class is picked again here. The processes the engine starts (its
    EngineCore) inherit the variable, so what they create lands there too.
    """
    os.makedirs(directory, exist_ok=True)
    os.environ[_MULTIPROC_DIR] = directory
    values.ValueClass = values.get_value_class()


def engine_families(families: Iterable[Metric]) -> list[Metric]:
    """The ``vllm:`` families among ``families``."""
    return [family for family in families if family.name.startswith(ENGINE_PREFIX)]


def without_gauges(families: Iterable[Metric]) -> list[Metric]:
    """``families`` as a stage that no longer runs shows them: its counters
    and histograms, no gauge."""
    return [family for family in families if family.type != "gauge"]


class StageMetricsSource(Protocol):
    """Where the engine metrics of some stages come from."""

    def stage_families(self) -> Iterable[tuple[int, list[Metric]]]:
        """Each stage's ``vllm:`` families, as its engine defines them; no
        gauges for a stage that no longer runs."""
        ...


class StageDirectories:
    """The multiprocess files of local stage processes: one directory each."""

    def __init__(self, root: str) -> None:
        self.root = root
        # Stage id → whether its process still runs.
        self._running: dict[int, Callable[[], bool]] = {}

    def directory(self, stage_id: int) -> str:
        return os.path.join(self.root, f"stage-{stage_id}")

    def add(self, stage_id: int, running: Callable[[], bool]) -> None:
        self._running[stage_id] = running

    def stage_families(self) -> Iterable[tuple[int, list[Metric]]]:
        for stage_id, running in list(self._running.items()):
            files = glob.glob(os.path.join(self.directory(stage_id), "*.db"))
            try:
                families = engine_families(MultiProcessCollector.merge(files))
            except FileNotFoundError:
                continue  # the engine is shutting down and removing them
            yield stage_id, families if running() else without_gauges(families)


def _labelled(stage_id: int, family: Metric, into: Metric) -> None:
    stage = str(stage_id)
    for sample in family.samples:
        labels = dict(sample.labels)
        if STAGE_LABEL in labels:
            labels[_EXPORTED_STAGE_LABEL] = labels.pop(STAGE_LABEL)
        labels[STAGE_LABEL] = stage
        into.samples.append(sample._replace(labels=labels))


class StageMetricsCollector(Collector):
    """Collects every registered source's stage families, labelled by stage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: list[StageMetricsSource] = []

    def add(self, source: StageMetricsSource) -> None:
        with self._lock:
            self._sources.append(source)

    def remove(self, source: StageMetricsSource) -> None:
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)

    def describe(self) -> list[Metric]:
        # Names come and go with stages: nothing to reserve in the registry.
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            sources = list(self._sources)
        merged: dict[str, Metric] = {}
        for source in sources:
            for stage_id, families in source.stage_families():
                for family in families:
                    into = merged.get(family.name)
                    if into is None:
                        into = merged[family.name] = Metric(
                            family.name, family.documentation, family.type, family.unit
                        )
                    _labelled(stage_id, family, into)
        return list(merged.values())


def _register() -> StageMetricsCollector:
    collector = StageMetricsCollector()
    REGISTRY.register(collector)
    return collector


# The one collector of this process, on the registry ``/metrics`` exposes.
STAGE_METRICS = _register()
