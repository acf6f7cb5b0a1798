"""A ``vllm`` stage killed while its ``AsyncLLM`` starts takes its EngineCore
with it: the start fails with a ``StageStartupError`` naming the stage, and
no EngineCore or model worker of that engine is left running (they used to be
re-parented to init and keep their memory)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.real_engine.conftest import STARTUP_TIMEOUT_S, write_tiny_pipeline
from vllm_omni.engine.stage_handle import StageStartupError
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import VLLMValidationError

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


def test_fault_tolerance_is_refused_at_load_with_one_line(
    tmp_path: Path, tiny_model: Path
) -> None:
    """vLLM runs fault tolerance only with external-load-balancer data
    parallelism, which this pipeline does not configure: ``vllm-omni serve``
    refuses it at load, in one line naming the option and why, before vLLM
    is imported (instead of vLLM's own error at the stage's start); ``Omni``
    the same."""
    path = write_tiny_pipeline(tmp_path, tiny_model, enable_fault_tolerance=True)
    option = "stages[1].options.engine_args.enable_fault_tolerance"
    serve = [sys.executable, "-m", "vllm_omni.entrypoints.cli.main", "serve"]
    started = time.monotonic()
    done = subprocess.run(
        [*serve, "--pipeline", str(path), "--port", "8000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert option in line and "fault tolerance is not supported" in line
    assert "external-load-balancer data parallelism" in line
    assert time.monotonic() - started < 60  # no engine was started
    with pytest.raises(VLLMValidationError) as info:
        Omni(pipeline=str(path), startup_timeout_s=STARTUP_TIMEOUT_S)
    assert info.value.parameter == option
