"""One reference engine for the entrypoint tests, started once per session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from vllm_omni.engine import processes

# One launcher for the whole session (it imports vLLM once).
processes.hold()

from vllm_omni.entrypoints.async_omni import AsyncOmni  # noqa: E402


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def reference_engine() -> AsyncIterator[AsyncOmni]:
    engine = await AsyncOmni.create(pipeline="reference")
    yield engine
    engine.shutdown()
