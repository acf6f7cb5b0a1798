"""The real engine in the orchestrator's process (``in_process: true``).

The same requests get the same answers and the same records as from a
stage process (``test_offline``'s pipeline, LoRA off); an engine abort the
server did not ask for is a retryable 503, never a finish; the engine's
metrics carry the ``stage`` label; a SIGKILL of the EngineCore with no
request in flight kills the engine with the stage's id (nothing but the
watch can notice it: there is no stage process to exit); and a plain
script without the ``__main__`` guard runs once, although vLLM's CPU build
spawns the EngineCore from the caller's process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import yaml

from tests.prom import local_text, samples, value
from tests.real_engine.conftest import STARTUP_TIMEOUT_S, write_tiny_pipeline
from tests.real_engine.tiny_model import MAX_MODEL_LEN
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import (
    OmniEngineDeadError,
    OmniServiceUnavailableError,
    VLLMValidationError,
)
from vllm_omni.errors.render import should_retry

pytestmark = pytest.mark.timeout(600)

STAGE_ID = 1
FULL = {"max_tokens": 8, "ignore_eos": True}
LONG_PROMPT = "hello " * (MAX_MODEL_LEN * 4)
MODELS = {"in_process": "tiny-here", "process": "tiny-there"}
LABELS = {"model_name": MODELS["in_process"], "engine": "0", "stage": str(STAGE_ID)}


@pytest.fixture(scope="module")
def engines(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[dict[str, Omni]]:
    """The same pipeline twice: the ``vllm`` stage in process, and in a stage
    process of its own."""
    root = tmp_path_factory.mktemp("real-in-process")
    started: dict[str, Omni] = {}
    try:
        for name, in_process in (("in_process", True), ("process", False)):
            path = write_tiny_pipeline(root / name, tiny_model, in_process=in_process)
            # Each its own served model name: their engine metrics never mix.
            document = yaml.safe_load(path.read_text())
            document["model"] = MODELS[name]
            path.write_text(yaml.safe_dump(document))
            started[name] = Omni(
                pipeline=str(path), startup_timeout_s=STARTUP_TIMEOUT_S
            )
        yield started
    finally:
        for omni in started.values():
            omni.close()


def _engine_cores() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.name() == "VLLM::EngineCore"
    ]


def test_the_same_answers_and_records_from_either_placement(
    engines: dict[str, Omni],
) -> None:
    inline, process = engines["in_process"], engines["process"]
    here = inline.generate("hello world", modalities=["text"], params=FULL)
    there = process.generate("hello world", modalities=["text"], params=FULL)
    assert here.text == there.text and here.finish_reason == "length"
    errors = {}
    for name, omni in engines.items():
        with pytest.raises(VLLMValidationError) as info:
            omni.generate(LONG_PROMPT, modalities=["text"], params={"max_tokens": 4})
        errors[name] = info.value.details  # type: ignore[attr-defined]
    # The same record but for the request id each engine made up.
    assert replace(errors["in_process"], request_id=None) == replace(
        errors["process"], request_id=None
    )
    assert (errors["in_process"].status_code, errors["in_process"].parameter) == (
        400,
        "input_text",
    )
    assert errors["in_process"].stage_id == STAGE_ID
    labels = LABELS
    seen = samples(local_text())
    finished = (
        "vllm:request_success_total",
        frozenset({**labels, "finished_reason": "length"}.items()),
    )
    assert seen[finished] >= 1
    assert ("vllm:num_requests_running", frozenset(labels.items())) in seen


def test_an_engine_abort_nobody_asked_for_is_never_a_success(
    engines: dict[str, Omni],
) -> None:
    """The real ``AsyncLLM`` ends a request it aborted with a last output of
    finish reason ``"abort"`` and no error (vLLM 0.34's fault tolerance does
    so to every request of a faulted engine). Aborted behind the server's
    back, after its first token, the request fails with a retryable 503
    naming the stage, not a finished output with half the text."""
    omni = engines["in_process"]
    handle = omni.engine._orchestrator.supervisor.handles[STAGE_ID]  # type: ignore[attr-defined]
    llm = handle.inline._stage._engine

    async def dropped() -> BaseException | None:
        aborted = False
        try:
            async for output in omni.engine.generate(
                "hello", modalities=["text"], params={**FULL, "max_tokens": 32}
            ):
                if output.finished:
                    return None
                if not aborted:
                    aborted = True
                    await llm.abort(list(llm.output_processor.external_req_ids))
        except Exception as exc:
            return exc
        return None

    error = omni._call(dropped(), 120)  # type: ignore[attr-defined]
    assert isinstance(error, OmniServiceUnavailableError), error
    details = error.details  # type: ignore[attr-defined]
    assert (details.status_code, details.error_type, details.stage_id) == (
        503,
        "ServiceUnavailableError",
        STAGE_ID,
    )
    assert should_retry(details)
    # The engine keeps serving.
    assert omni.generate("hello", modalities=["text"], params=FULL).text


def test_an_engine_core_killed_while_idle_kills_the_engine(
    engines: dict[str, Omni],
) -> None:
    omni = engines["in_process"]
    cores = _engine_cores()
    # Two engines: the stage process's EngineCore is not this process's child.
    (core,) = [c for c in cores if c.ppid() == os.getpid()]
    core.kill()
    # Nothing in flight: only the watch can notice (engine_dead is 1).
    deadline = time.monotonic() + 30
    while value(local_text(), "vllm_omni:engine_dead") != 1:
        assert time.monotonic() < deadline, "the dead EngineCore went unnoticed"
        time.sleep(0.1)
    with pytest.raises(OmniEngineDeadError) as info:
        omni.generate("hello", modalities=["text"], params={"max_tokens": 2})
    assert info.value.stage_id == STAGE_ID
    assert info.value.details.fatal and info.value.details.status_code == 500
    # The engine's gauges left /metrics with it; its counters stayed.
    seen = samples(local_text())
    assert ("vllm:num_requests_running", frozenset(LABELS.items())) not in seen
    success = {**LABELS, "finished_reason": "length"}
    assert ("vllm:request_success_total", frozenset(success.items())) in seen


def test_a_script_without_the_main_guard_runs_once(
    tmp_path: Path, tiny_model: Path
) -> None:
    path = write_tiny_pipeline(tmp_path, tiny_model, in_process=True)
    script = tmp_path / "plain.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from vllm_omni.entrypoints.omni import Omni

            print("SCRIPT STARTS", flush=True)
            pipeline = {str(path)!r}
            with Omni(pipeline=pipeline, startup_timeout_s={STARTUP_TIMEOUT_S}) as omni:
                out = omni.generate("hello", modalities=["text"], params={FULL!r})
                print("RESULT", out.finish_reason, flush=True)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S + 60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("SCRIPT STARTS") == 1, done.stdout
    assert done.stdout.count("RESULT length") == 1, done.stdout
