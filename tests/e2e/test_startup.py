"""``vllm-omni serve`` on a fresh machine: fast, one-line failures; clean exit.

Each bad configuration an operator can make (command line, pipeline file,
job store held by another server, port in use) is checked before vLLM is
imported: the real CLI exits non-zero in under 3 s with exactly one line on
stderr and no traceback. A fault entry that cannot be built is only known
once vLLM's classes are imported, but still fails startup with one line. A
served process leaves no process of its tree alive 2 s after SIGTERM.
"""

from __future__ import annotations

import fcntl
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.e2e.omni_server import (
    REFERENCE_STAGES,
    Background,
    OmniServer,
    start_in_background,
    start_server,
)
from tests.e2e.servers import free_port

PROG = "vllm-omni serve: error: "
_SERVE = (sys.executable, "-m", "vllm_omni.entrypoints.cli.main", "serve")
FAST_S = 3.0


def _serve(
    *args: str, job_store: Path, timeout: float = 60.0
) -> tuple[int, str, float]:
    argv = [*_SERVE, "--job-store", str(job_store), *args]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stderr, time.monotonic() - start


def _pipeline(directory: Path, document: Any) -> Path:
    path = directory / "pipeline.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return path


GOOD: dict[str, Any] = {"model": "m", "stages": REFERENCE_STAGES}
NO_GUARDRAIL = [s for s in REFERENCE_STAGES if s["kind"] != "guardrail"]


@pytest.fixture
def held_job_store(tmp_path: Path) -> Iterator[Path]:
    """A job store whose lock another live process holds."""
    store = tmp_path / "held" / "jobs.sqlite3"
    store.parent.mkdir()
    with Path(f"{store}.lock").open("a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield store


@pytest.fixture(params=["plain", "SO_REUSEPORT"])
def busy_port(request: pytest.FixtureRequest) -> Iterator[int]:
    """A port something listens on: a plain socket, or one with
    ``SO_REUSEPORT`` as each process of ``--api-server-count N`` listens
    (another server of this user must not join that port's group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if request.param == "SO_REUSEPORT":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_bad_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    path = _pipeline(tmp_path, "model: m\nstages: [\n  {id: 0, kind: text\n")
    code, stderr, took = _serve("--pipeline", str(path), job_store=tmp_path / "j")
    assert code == 2 and took < FAST_S
    assert stderr == (
        f"{PROG}{path}:4:1: not valid YAML: expected ',' or '}}', "
        "but got '<stream end>'\n"
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {**GOOD, "stages": [{**REFERENCE_STAGES[0], "kind": "teleport"}]},
            "invalid pipeline config at stages[0].kind: stage kind must be one of",
        ),
        (
            {**GOOD, "stages": NO_GUARDRAIL, "guardrail": {"blocklist": ["x"]}},
            "invalid pipeline config at guardrail.blocklist: a blocklist needs a "
            "stage of kind 'guardrail' to enforce it",
        ),
    ],
)
def test_schema_errors_name_file_and_key_path(
    tmp_path: Path, document: Any, message: str
) -> None:
    path = _pipeline(tmp_path, document)
    code, stderr, took = _serve("--pipeline", str(path), job_store=tmp_path / "j")
    assert code == 2 and took < FAST_S
    assert stderr.startswith(f"{PROG}{path}: {message}")
    assert stderr.count("\n") == 1


def test_missing_file_says_it_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "pipelnie.yaml"
    code, stderr, took = _serve("--pipeline", str(missing), job_store=tmp_path / "j")
    assert code == 2 and took < FAST_S
    assert stderr == (
        f"{PROG}pipeline file {missing} does not exist (built-in pipelines: "
        "reference)\n"
    )


def test_job_store_held_by_another_server(held_job_store: Path) -> None:
    code, stderr, took = _serve(job_store=held_job_store)
    assert code == 2 and took < FAST_S
    assert stderr == (
        f"{PROG}the job store {held_job_store} is in use by another vllm-omni "
        "server; give each server its own --job-store\n"
    )


@pytest.mark.parametrize("count", ["1", "2"])
def test_port_in_use(tmp_path: Path, busy_port: int, count: str) -> None:
    code, stderr, took = _serve(
        "--port",
        str(busy_port),
        "--api-server-count",
        count,
        job_store=tmp_path / "j",
    )
    assert code == 2 and took < FAST_S
    assert stderr == (
        f"{PROG}cannot listen on 127.0.0.1:{busy_port}: Address already in use\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--port", "http"), "argument --port: invalid int value: 'http'"),
        (("--port", "70000"), "--port must be between 1 and 65535, not 70000"),
        (
            ("--startup-timeout", "0"),
            "argument --startup-timeout: must be a positive number",
        ),
        (
            ("--error-mode", "lenient"),
            "argument --error-mode: invalid choice: 'lenient' "
            "(choose from 'strict', 'legacy')",
        ),
    ],
)
def test_bad_command_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    code, stderr, took = _serve(*args, job_store=tmp_path / "j")
    assert code == 2 and took < FAST_S
    assert stderr == f"{PROG}{message}\n"


def test_a_stage_not_ready_within_the_startup_timeout(tmp_path: Path) -> None:
    """``--startup-timeout`` bounds the wait; the stage that was not ready is
    named in one line (a remote stage whose worker never connects)."""
    stages = [
        {"id": 0, "name": "thinker", "kind": "text"},
        {"id": 1, "name": "talker", "kind": "talker", "remote": True},
    ]
    path = _pipeline(tmp_path, {"model": "m", "stages": stages})
    code, stderr, _ = _serve(
        "--pipeline",
        str(path),
        "--port",
        str(free_port()),
        "--startup-timeout",
        "1.5",
        job_store=tmp_path / "j",
    )
    lines = [line for line in stderr.splitlines() if line.startswith(PROG)]
    assert code == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines == [
        f"{PROG}Stage 1 (talker) failed to start: not ready within 1.5 s "
        "(no remote worker connected)"
    ]


@dataclass
class _Heavy:
    fault_pipeline: Path
    fault: Background
    served: OmniServer
    imports: Background


_IMPORTS_PROBE = (
    "import sys\n"
    "import vllm_omni.engine.stage_worker\n"
    "from vllm_omni.entrypoints.cli.api_servers import import_server\n"
    "from vllm_omni.entrypoints.cli.serve import make_parser\n"
    "server = import_server()\n"
    "before = set(sys.modules)\n"
    "server.build_app(make_parser().parse_args([]))\n"
    "print(sorted(set(sys.modules) - before))\n"
)


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Heavy]:
    """The processes that import vLLM (seconds of CPU each), started together
    when the first of their tests starts, after every test that times a
    command or a startup deadline (an import beside them would slow those);
    each test waits for its own. ``fault``: ``serve`` on a pipeline with a
    fault entry that cannot be built; ``served``: a server on the reference
    pipeline, not yet ready; ``imports``: what building the app imports."""
    directory = tmp_path_factory.mktemp("startup-heavy")
    fault = {
        "stage": 1,
        "marker": "@x",
        "action": "raise",
        "exception": "vllm.exceptions:GenerationError",
        "args": [1, 2, 3, 4],
    }
    path = _pipeline(directory, {**GOOD, "faults": [fault]})
    started = _Heavy(
        path,
        start_in_background(
            directory,
            "fault",
            *_SERVE,
            "--job-store",
            str(directory / "j"),
            "--pipeline",
            str(path),
            "--port",
            str(free_port()),
        ),
        start_server(directory / "served"),
        start_in_background(directory, "imports", sys.executable, "-c", _IMPORTS_PROBE),
    )
    try:
        yield started
    finally:
        for each in (started.fault, started.served, started.imports):
            each.stop()


def test_fault_that_cannot_be_built_fails_startup_in_one_line(heavy: _Heavy) -> None:
    """Known only once vLLM's classes load, but still one line, no traceback."""
    path = heavy.fault_pipeline
    code, _, stderr = heavy.fault.result(timeout=60)
    lines = [line for line in stderr.splitlines() if line.startswith(PROG)]
    assert code == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(
        f"{PROG}{path}: invalid pipeline config at faults[0].args: "
        "vllm.exceptions:GenerationError cannot be built from args/kwargs (TypeError:"
    ), stderr[-3000:]


_STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
_GUARDRAIL_LINE = re.compile(
    rf"^{_STAMP}INFO stage-0 \[log-probe-1\] stage 0 request log-probe-1 failed "
    r"\(GuardrailViolationError 400\)$"
)


def test_no_process_of_the_server_tree_survives_sigterm(heavy: _Heavy) -> None:
    """Also: stage log lines are whole, stamped with time, stage and request."""
    server = heavy.served
    try:
        server.wait_ready()
        refused = httpx.post(
            server.base_url + "/v1/chat/completions",
            headers={"X-Request-Id": "log-probe-1"},
            json={
                "model": "omni-reference",
                "messages": [{"role": "user", "content": "about forbidden-topic"}],
            },
            timeout=30,
        )
        assert refused.status_code == 400
        tree = psutil.Process(server.proc.pid).children(recursive=True)
        # The launcher (forked from the server) and five reference stages:
        # the guardrail runs in the server's process (vllm_omni.engine.inline).
        assert len(tree) == 6, tree
        launchers = [p for p in tree if p.ppid() == server.proc.pid]
        assert len(launchers) == 1
        assert {p.ppid() for p in tree} == {server.proc.pid, launchers[0].pid}
        server.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        server.proc.wait(timeout=10)
        time.sleep(max(0.0, sent + 2.0 - time.monotonic()))
        assert [p.pid for p in tree if _running(p)] == [], server.log()[-3000:]
    finally:
        server.stop()
    lines = server.log().splitlines()
    assert len([line for line in lines if _GUARDRAIL_LINE.match(line)]) == 1
    stage_lines = [line for line in lines if re.search(r" stage-\d+ \[", line)]
    assert stage_lines and all(re.match(_STAMP, line) for line in stage_lines)


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_serve_imports_nothing_on_the_engine_loop(heavy: _Heavy) -> None:
    """``vllm-omni serve`` imports the API server and every route module in a
    thread (they import vLLM's serving code: seconds, mostly holding the
    GIL); building the app on the engine's loop then imports nothing. Before,
    the route modules were imported there: the loop stood still for 10 to
    60 s while the engine already ran, sending no heartbeat, and a stage on
    another host with a shorter orchestrator timeout gave up on it."""
    code, stdout, stderr = heavy.imports.result(timeout=180)
    assert code == 0, stderr[-2000:]
    assert stdout.strip() == "[]"
