"""Engine metrics on a live reference server (issue 27).

The reference stages are not vLLM: ``/metrics`` has no ``vllm:`` family,
and every other series the shipped dashboard and alert rules query is
there. (The engine row's ``vllm:`` series are checked on a live server with
a ``vllm`` stage in ``tests/real_engine/test_side_by_side.py``.) The stages'
multiprocess directory exists while the server runs and is gone once it
stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.e2e.conftest import API_KEY
from tests.e2e.omni_server import OmniServer, start_server
from tests.observability.names import (
    ENGINE_PREFIX,
    exported_series,
    queried_series,
)
from tests.prom import samples, value

METRICS_DIR_PREFIX = "vllm-omni-metrics-"


def test_the_dashboard_and_rules_query_what_the_reference_server_exports(
    omni_server: OmniServer,
) -> None:
    headers = omni_server.headers()
    # One metered request, so the instrumentator's counter has a sample.
    assert httpx.get(omni_server.base_url + "/v1/models", headers=headers).is_success
    response = httpx.get(omni_server.base_url + "/metrics", headers=headers)
    assert response.status_code == 200
    exported = exported_series(response.text)
    used = queried_series()
    engine = {name for name in used if name.startswith(ENGINE_PREFIX)}
    assert engine and used - engine
    assert used - engine <= exported, used - engine - exported
    assert not {name for name in exported if name.startswith(ENGINE_PREFIX)}


def test_no_metrics_files_are_left_after_the_server_stops(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    server = start_server(tmp_path, api_key=API_KEY, env={"TMPDIR": str(temp)})
    try:
        server.wait_ready()
        response = httpx.post(
            server.base_url + "/v1/chat/completions",
            headers=server.headers(),
            json={"messages": [{"role": "user", "content": "hello"}]},
            timeout=30,
        )
        assert response.status_code == 200
        (directory,) = temp.glob(METRICS_DIR_PREFIX + "*")
        # One per stage process: the guardrail (stage 0) runs in the
        # server's process (engine.inline).
        assert sorted(p.name for p in directory.iterdir()) == [
            f"stage-{i}" for i in range(1, 6)
        ]
    finally:
        server.stop()
    assert server.proc.returncode == 0
    assert not list(temp.glob(METRICS_DIR_PREFIX + "*"))


def test_the_servers_event_loop_lag_is_a_histogram_that_grows(
    omni_server: OmniServer,
) -> None:
    """The engine's watch measures how late the server's loop runs its 0.1 s
    timer, every time, in the buckets the alert reads."""
    lag = "vllm_omni:event_loop_lag_seconds"

    def read() -> dict[str, float]:
        text = httpx.get(
            omni_server.base_url + "/metrics", headers=omni_server.headers()
        ).text
        buckets = {
            labels["le"]: v
            for (name, labels_set), v in samples(text).items()
            if name == lag + "_bucket"
            for labels in [dict(labels_set)]
        }
        return {"count": value(text, lag + "_count"), **buckets}

    before = read()
    time.sleep(1.0)
    after = read()
    assert after["count"] > before["count"]
    assert after["+Inf"] == after["count"]
    bounds = sorted((float(le), n) for le, n in after.items() if le != "count")
    assert [n for _, n in bounds] == sorted(n for _, n in bounds)
    assert {0.25, 1.0} <= {le for le, _ in bounds}
