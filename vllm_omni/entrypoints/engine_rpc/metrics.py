"""``/metrics`` in an API server process: the sums over every process.

Every process of the server (the engine process and each API server
process) keeps its metrics in prometheus_client's multiprocess files in one
directory (``PROMETHEUS_MULTIPROC_DIR``, set by ``vllm-omni serve`` before
any metric exists), as ``vllm serve --api-server-count N`` does; a scrape
of any API server merges them (counters and histograms summed, the engine's
gauges as the engine process set them). The stages' ``vllm:`` families
come from the engine process, labelled with their ``stage`` as with one
process; the unlabelled copies an in-process ``vllm`` stage leaves in the
directory are skipped.
"""

from __future__ import annotations

import asyncio
import glob
import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from vllm_omni.engine.stage_metrics import ENGINE_PREFIX

__all__ = ["MULTIPROC_DIR", "metrics_endpoint", "process_families"]

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def process_families() -> list[Metric]:
    """Every process's own families, merged (no stage's ``vllm:`` ones)."""
    files = glob.glob(os.path.join(os.environ[MULTIPROC_DIR], "*.db"))
    return [
        family
        for family in MultiProcessCollector.merge(files, accumulate=True)
        if not family.name.startswith(ENGINE_PREFIX)
    ]


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics`` of an API server process."""
    engine = request.app.state.engine_client
    stages = await engine.stage_families()
    own = await asyncio.to_thread(process_families)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(own + stages))
    return Response(generate_latest(registry), media_type=_CONTENT_TYPE)
