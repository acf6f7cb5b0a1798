"""Engines for the runtime tests: started once per session, shut down at the end.

The launcher that makes stage processes imports vLLM once (several
seconds); starting it here overlaps that with test collection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from vllm_omni.engine import processes

# One launcher for the whole session (it imports vLLM once).
processes.hold()

from tests.engine.engines import write_pipeline  # noqa: E402
from vllm_omni.entrypoints.async_omni import AsyncOmni  # noqa: E402

# Stage 1 (text) has a short deadline so the timeout test is quick; stage 2
# (talker) a long one so a request can be held there while it is cancelled.
DRILL = {
    "model": "omni-drill",
    "stages": [
        {"id": 0, "name": "guardrail", "kind": "guardrail"},
        {"id": 1, "name": "thinker", "kind": "text", "timeout_s": 1.0},
        {"id": 2, "name": "talker", "kind": "talker", "timeout_s": 30},
        {"id": 3, "name": "vocoder", "kind": "vocoder", "timeout_s": 30},
    ],
    "guardrail": {"blocklist": ["forbidden-topic"]},
    "faults": [
        {"stage": 1, "marker": "@raise", "action": "raise"},
        {"stage": 1, "marker": "@hang", "action": "hang"},
        {"stage": "talker", "marker": "@talker-hang", "action": "hang"},
        {
            "stage": 1,
            "marker": "@cancel",
            "action": "raise",
            "exception": "asyncio.exceptions:CancelledError",
        },
    ],
}


@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipelines")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def drill_engine(pipeline_dir: Path) -> AsyncIterator[AsyncOmni]:
    engine = await AsyncOmni.create(pipeline=write_pipeline(pipeline_dir, DRILL))
    yield engine
    engine.shutdown()
