"""Credentials never reach a log line; paths and tracebacks do (issue 24).

Secrets are planted in the text of exceptions raised where the project
logs them with their traceback: in a stage (the shared ``vllm-omni serve``:
a chat request and a video job whose stage raises), and in a route and a
realtime session of the API server itself (in process, on a stand-in engine
that raises, with the server's logging set up as ``vllm-omni serve`` sets
it). Every captured log line is then searched for the planted values; the
failures must be there, with their paths, tracebacks and request ids, and
``<redacted>`` where the credentials were.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.e2e.omni_server import (
    LOG_SECRET_PATH,
    LOG_SECRET_TEXT,
    LOG_SECRETS,
    OmniServer,
)
from tests.e2e.servers import serve_in_thread
from vllm_omni.config import StageConfig
from vllm_omni.errors.logs import install_log_redaction
from vllm_omni.outputs import OmniRequestOutput


def _planted(log: str) -> list[str]:
    return [secret for secret in LOG_SECRETS if secret in log]


def test_stage_and_job_logs(omni_server: OmniServer) -> None:
    chat = httpx.post(
        omni_server.base_url + "/v1/chat/completions",
        headers=omni_server.headers(),
        json={"messages": [{"role": "user", "content": "x @logsecret"}]},
        timeout=30,
    )
    assert chat.status_code == 500
    request_id = chat.headers["x-request-id"]
    job = httpx.post(
        omni_server.base_url + "/v1/videos",
        headers=omni_server.headers(),
        json={"prompt": "clip @vlogsecret", "seconds": "1"},
        timeout=30,
    ).json()
    deadline = time.monotonic() + 30
    while job["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
        job = httpx.get(
            f"{omni_server.base_url}/v1/videos/{job['id']}",
            headers=omni_server.headers(),
        ).json()
    assert job["status"] == "failed"
    # Both stages logged the failure with its traceback (one line each,
    # " | " between the traceback's lines), the job's failure too; the
    # server's line names the stage whose line has the cause, without a
    # traceback of its own (it would show only the way the record came).
    for stage, rid in ((1, request_id), (5, job["id"])):
        omni_server.wait_for_log(
            rf"stage {stage} request {rid} failed \(InternalServerError 500\)"
            rf".*Traceback.*RuntimeError: failed reading {re.escape(LOG_SECRET_PATH)}"
            r": token <redacted>",
            rf"ERROR vllm_omni.errors: request {rid} failed with 500 "
            rf"InternalServerError: OmniEngineGenerateError in stage {stage} "
            r"\(its log has the cause\)\n(?!Traceback)",
            within_s=10,
        )
    assert _planted(omni_server.log()) == []


# -- the API server's own code raising (in process) ---------------------------------


class _RaisingEngine:
    """A text engine whose requests fail in the server process itself: after
    one delta when the prompt asks for a stream failure, else at once."""

    model_name = "omni-reference"
    modalities = frozenset({"text"})
    errored = False
    is_running = True

    async def check_health(self) -> None:
        return None

    def hold_admission(
        self, request_id: str
    ) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def stage_for(self, modality: str) -> StageConfig | None:
        return StageConfig(1, "thinker", "text") if modality == "text" else None

    async def generate(
        self,
        prompt: str,
        *,
        request_id: str,
        modalities: Any,
        params: Any,
        sampling_params_list: Any = None,
        trace_headers: Any = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        if "later" in prompt:
            yield OmniRequestOutput(request_id=request_id, text_delta="w ")
        raise RuntimeError(LOG_SECRET_TEXT)


@pytest.fixture()
def server_log(tmp_path: Path) -> Iterator[Path]:
    """This process's logging as ``vllm-omni serve`` sets it up, into a file."""
    path = tmp_path / "server.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    factory = logging.getLogRecordFactory()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    install_log_redaction()
    try:
        yield path
    finally:
        logging.setLogRecordFactory(factory)
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def test_route_and_realtime_logs(server_log: Path) -> None:
    from vllm_omni.entrypoints.openai.api_server import build_app

    app = build_app(argparse.Namespace(api_key=None, error_mode="strict"))
    app.state.engine_client = _RaisingEngine()
    with serve_in_thread(app) as url:
        chat = url + "/v1/chat/completions"
        failed = httpx.post(
            chat, json={"messages": [{"role": "user", "content": "now"}]}
        )
        assert failed.status_code == 500
        with httpx.stream(
            "POST",
            chat,
            json={"messages": [{"role": "user", "content": "later"}], "stream": True},
        ) as stream:
            assert stream.status_code == 200
            events = [line for line in stream.iter_lines() if line]
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 500
        with connect(url.replace("http://", "ws://") + "/v1/realtime") as ws:
            ws.recv(timeout=10)
            ws.send(
                json.dumps(
                    {"type": "response.create", "response": {"instructions": "now"}}
                )
            )
            kinds = [json.loads(ws.recv(timeout=10))["type"] for _ in range(2)]
        assert kinds == ["response.created", "error"]
    log = server_log.read_text()
    ids = [failed.headers["x-request-id"]]
    # Three failures, each logged with its request id and whole traceback.
    assert log.count("failed with 500 InternalServerError: RuntimeError") == 3, log
    assert f"request {ids[0]} failed" in log
    assert log.count("Traceback (most recent call last):") == 3
    assert log.count(f"RuntimeError: failed reading {LOG_SECRET_PATH}") == 3
    assert log.count("<redacted>") >= 3 * len(LOG_SECRETS)
    assert _planted(log) == []
