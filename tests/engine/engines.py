"""Helpers shared by the runtime tests: pipeline files and engine start/stop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.outputs import OmniRequestOutput

_ids = itertools.count()


def write_pipeline(directory: Path, document: Mapping[str, Any]) -> Path:
    """Write a pipeline YAML document and return its path."""
    path = directory / f"pipeline-{next(_ids)}.yaml"
    path.write_text(yaml.safe_dump(dict(document)))
    return path


async def collect(
    engine: AsyncOmni,
    prompt: str,
    *,
    request_id: str,
    modalities: Iterable[str] = ("text",),
    params: Mapping[str, Any] | None = None,
) -> list[OmniRequestOutput]:
    """All outputs of one request (raises what ``generate`` raises)."""
    return [
        out
        async for out in engine.generate(
            prompt, request_id=request_id, modalities=modalities, params=params
        )
    ]


async def wait_for(
    predicate: Any, timeout_s: float = 5.0, interval_s: float = 0.02
) -> None:
    """Poll an async predicate until true, or fail the test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval_s)


async def stage_active(engine: AsyncOmni, stage_id: int, request_id: str) -> bool:
    stats = (await engine.stage_stats())[stage_id]
    return stats is not None and request_id in stats["active"]


async def drain(stream: AsyncIterator[OmniRequestOutput]) -> OmniRequestOutput:
    final = None
    async for final in stream:  # noqa: B007
        pass
    assert final is not None
    return final
