"""A burst's refusals go out before its admitted requests' work (issue 46).

Requests that arrive together run their early admission check in turn: the
ones let through hold their place and wait one turn of the event loop, so
that the requests behind them are refused (a few hundred microseconds each)
before any admitted request builds its prompt and submits it. Driven through
the whole app (the error boundary, the metrics, the images route) on a
stand-in engine whose admission counts held places as the engine does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx

from vllm_omni.config import StageConfig
from vllm_omni.engine.request_table import (
    AdmissionHolds,
    refuse_over_limit,
    release_held_place,
)
from vllm_omni.entrypoints.openai.api_server import build_app

LIMIT = 2
BURST = 8


class _Engine:
    """Admission as ``RequestTable`` keeps it: in flight plus held places."""

    model_name = "omni-reference"
    modalities = frozenset({"image"})
    errored = False
    is_running = True

    def __init__(self) -> None:
        self.holds = AdmissionHolds()
        self.in_flight = 0
        self.events: list[tuple[str, str]] = []

    async def check_health(self) -> None:
        return None

    def stage_for(self, modality: str) -> StageConfig | None:
        return StageConfig(4, "image", "image") if modality == "image" else None

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        try:
            refuse_over_limit(request_id, self.in_flight + self.holds.count, LIMIT)
        except Exception:
            self.events.append(("refused", request_id))
            raise
        return self.holds.hold()

    async def generate(
        self, prompt: str, *, request_id: str, **kwargs: Any
    ) -> AsyncIterator[SimpleNamespace]:
        release_held_place()
        refuse_over_limit(request_id, self.in_flight + self.holds.count, LIMIT)
        self.in_flight += 1
        self.events.append(("submitted", request_id))
        try:
            await asyncio.sleep(0.01)
            yield SimpleNamespace(images=[b"\x89PNG\r\n\x1a\n"], finished=True)
        finally:
            self.in_flight -= 1


async def test_refusals_are_answered_before_admitted_work() -> None:
    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    engine = _Engine()
    app.state.engine_client = engine
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://omni") as http:
        responses = await asyncio.gather(
            *(
                http.post(
                    "/v1/images/generations",
                    json={"prompt": f"burst {i}", "size": "64x64"},
                    headers={"X-Request-Id": f"burst-{i}"},
                )
                for i in range(BURST)
            )
        )
    statuses = [r.status_code for r in responses]
    assert statuses == [200] * LIMIT + [503] * (BURST - LIMIT), statuses
    for refused in responses[LIMIT:]:
        assert refused.headers["retry-after"] == "1"
        assert json.loads(refused.text)["error"]["code"] == 503
    kinds = [kind for kind, _ in engine.events]
    # Every refusal before the first admitted request's submission.
    assert kinds == ["refused"] * (BURST - LIMIT) + ["submitted"] * LIMIT, engine.events
    assert (engine.in_flight, engine.holds.count) == (0, 0)
