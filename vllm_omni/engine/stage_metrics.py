"""The engines' own ``vllm:*`` metrics, brought from the stages to this process.

Reads each stage's samples (multiprocess files, a Ray actor, an in-process
registry) and adds the ``stage`` label (docs/runtime.md §11). It must not
define or copy a metric, and decides nothing about requests.
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
