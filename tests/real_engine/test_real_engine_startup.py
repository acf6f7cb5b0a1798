"""A ``vllm`` stage killed while its ``AsyncLLM`` starts takes its EngineCore
with it: the start fails with a ``StageStartupError`` naming the stage, and
no EngineCore or model worker of that engine is left running (they used to be
re-parented to init and keep their memory)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.real_engine.conftest import STARTUP_TIMEOUT_S, write_tiny_pipeline
from vllm_omni.engine.orchestrator import StageStartupError
from vllm_omni.entrypoints.omni import Omni

pytestmark = pytest.mark.timeout(600)

STAGE_ID = 1


def _engine_processes() -> dict[int, psutil.Process]:
    found = {}
    for process in psutil.process_iter(["name"]):
        if (process.info["name"] or "").startswith("VLLM::"):
            found[process.pid] = process
    return found


def test_a_stage_killed_while_its_engine_starts_leaves_nothing_behind(
    tmp_path: Path, tiny_model: Path
) -> None:
    pipeline = write_tiny_pipeline(tmp_path, tiny_model)
    before = set(_engine_processes())
    outcome: dict[str, Any] = {}

    def start() -> None:
        try:
            with Omni(pipeline=str(pipeline), startup_timeout_s=STARTUP_TIMEOUT_S):
                outcome["started"] = True
        except Exception as exc:  # read by the test thread
            outcome["error"] = exc

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    core: psutil.Process | None = None
    while core is None:
        assert time.monotonic() < deadline and starter.is_alive(), outcome
        core = next(
            (
                p
                for pid, p in _engine_processes().items()
                if pid not in before and p.name() == "VLLM::EngineCore"
            ),
            None,
        )
        time.sleep(0.05)
    stage = psutil.Process(core.ppid())
    stage.kill()  # mid-start: the EngineCore is loading the model
    starter.join(timeout=120)
    assert not starter.is_alive()
    error = outcome.get("error")
    assert isinstance(error, StageStartupError), outcome
    assert error.stage_id == STAGE_ID
    assert str(error).startswith(f"Stage {STAGE_ID} (thinker) failed to start")
    left = [p for pid, p in _engine_processes().items() if pid not in before]
    _, alive = psutil.wait_procs([core, *left], timeout=5)
    assert alive == []
