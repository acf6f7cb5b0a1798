"""Start real ``vllm-omni serve`` processes for end-to-end tests.

Each server is a separate process on a free loopback port, with its log in a
file (an unread pipe would fill and block it) and a private job store.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.servers import free_port

REFERENCE_STAGES: list[dict[str, Any]] = [
    {"id": 0, "name": "guardrail", "kind": "guardrail", "timeout_s": 10},
    {"id": 1, "name": "thinker", "kind": "text", "timeout_s": 3},
    {"id": 2, "name": "talker", "kind": "talker", "timeout_s": 10},
    {"id": 3, "name": "vocoder", "kind": "vocoder", "timeout_s": 10},
    {"id": 4, "name": "image", "kind": "image", "timeout_s": 30},
    {"id": 5, "name": "video", "kind": "video", "timeout_s": 60},
]

# The two classes an independent corpus found leaking (issue 40): a GitHub
# fine-grained token as GitHub issues it (82 characters after the prefix, no
# "gh" among them) and a hex token after a weak name (``token: …``).
LEAK_GITHUB_PAT = (
    "github_pat_11LEAK0Q00xY7kLm3NpQ9r_StUvWz1AxY7kLm3NpQ9rStUvWz1AxY7kLm3NpQ9r"
    "StUvWz1AxY7kLm3LEAK"
)
LEAK_HEX_TOKEN = "5e1f0a9c3b7d2e48"

# Private things a careless error message could carry. None may reach a
# client, a job store, an INFO log line or a metric label.
LEAK_SECRETS: tuple[str, ...] = (
    "/home/alice",
    "/srv/omni/stages",
    "Traceback (most recent",
    'File "',
    "hf_LEAKLEAKLEAK42",
    "sk-proj-LEAKLEAK42",
    "sk-live-REJECTEDVALUE",
    "AKIALEAKLEAKLEAK4242",
    "hunter2-password",
    "bob:s3cr3t@",
    "eyJhbGciOiJIUzI1NiJ9.leak",
    "iVBORw0KGgoAAAANSUhEUg",
    "0x7f3a9c2b1d40",
    LEAK_GITHUB_PAT,
    LEAK_HEX_TOKEN,
)
LEAK_TEXT = (
    'Traceback (most recent call last):\n  File "/srv/omni/stages/text.py", line 9,'
    " in run\n    boom()\nfailed for /home/alice/data/in.wav"
    " with token hf_LEAKLEAKLEAK42,"
    " key sk-proj-LEAKLEAK42, aws AKIALEAKLEAKLEAK4242, password=hunter2-password,"
    " url https://bob:s3cr3t@example.com/x, Authorization: Bearer"
    " eyJhbGciOiJIUzI1NiJ9.leak, image data:image/png;base64,iVBORw0KGgoAAAANSUhEUg"
    "AAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk, object <Tensor at 0x7f3a9c2b1d40>,"
    f" github {LEAK_GITHUB_PAT}, config token: {LEAK_HEX_TOKEN}"
)

# Credentials a failure's own text carries (issue 24): none may reach a log
# line, while the path and the traceback around them stay for the operator.
LOG_SECRETS: tuple[str, ...] = (
    "hf_LOGLOGLOG4242",
    "sk-proj-LOGSECRET42",
    "AKIALOGLOGLOG4242XYZ",
    "log-hunter2",
    "logs3cr3t",
    "eyJhbGciOiJIUzI1NiJ9.logleak",
    "ghp_LOGLOGLOGLOGLOGLOGLOGLOGLOGLOGLOGLOG42",
    "xoxb-1234567890-LOGLOGslack",
    "github_pat_11LOG00Q00xY7kLm3NpQ9r_StUvWz1AxY7kLm3NpQ9rStUvWz1AxY7kLm3NpQ9r"
    "StUvWz1AxY7kLm3NLOG",
    "a4c9e2f7b1d83065",
)
LOG_SECRET_PATH = "/home/alice/.hf/token"
LOG_SECRET_TEXT = (
    f"failed reading {LOG_SECRET_PATH}: token {LOG_SECRETS[0]}, key {LOG_SECRETS[1]},"
    f" aws {LOG_SECRETS[2]}, password={LOG_SECRETS[3]},"
    f" url https://bob:{LOG_SECRETS[4]}@example.com/x,"
    f" Authorization: Bearer {LOG_SECRETS[5]}, github {LOG_SECRETS[6]},"
    f" slack {LOG_SECRETS[7]}, fine-grained {LOG_SECRETS[8]},"
    f" config token: {LOG_SECRETS[9]}"
)
# The issue-40 classes in a text with no "gh" anywhere, as the prefilter
# once needed to skip the vendor rule for a fine-grained GitHub token.
LOG_FINE_GRAINED_TEXT = (
    f"failed reading {LOG_SECRET_PATH}: token {LOG_SECRETS[0]},"
    f" fine-grained {LOG_SECRETS[8]}, config token: {LOG_SECRETS[9]}"
)

# Markers a prompt can carry to make a stage misbehave (tests and drills).
FAULTS: list[dict[str, Any]] = [
    {"stage": 1, "marker": "@boom", "action": "raise"},
    {"stage": 1, "marker": "@hang", "action": "hang"},
    {"stage": 2, "marker": "@talkboom", "action": "raise"},
    {"stage": 2, "marker": "@talkhang", "action": "hang"},
    {"stage": 3, "marker": "@die", "action": "exit"},
    {
        "stage": 1,
        "marker": "@generation",
        "action": "raise",
        "exception": "vllm.exceptions:GenerationError",
        "args": ["KV cache load failed"],
    },
    {
        "stage": 1,
        "marker": "@retryable",
        "action": "raise",
        "exception": "vllm.exceptions:RetryableRequestError",
    },
    {
        "stage": 1,
        "marker": "@overflow",
        "action": "raise",
        "exception": "vllm.exceptions:QueueOverflowError",
    },
    {
        "stage": 1,
        "marker": "@unavailable",
        "action": "raise",
        "exception": "vllm_omni.errors:OmniServiceUnavailableError",
        "args": ["talker pool drained"],
    },
    {
        "stage": 1,
        "marker": "@secret",
        "action": "raise",
        "exception": "builtins:RuntimeError",
        "args": [
            "failed reading /home/alice/.hf/token hf_SECRETSECRET123 Bearer abc.def"
        ],
    },
    {
        "stage": 1,
        "marker": "@logsecret",
        "action": "raise",
        "exception": "builtins:RuntimeError",
        "args": [LOG_SECRET_TEXT],
    },
    {
        "stage": 5,
        "marker": "@vlogsecret",
        "action": "raise",
        "exception": "builtins:RuntimeError",
        "args": [LOG_FINE_GRAINED_TEXT],
    },
    # Leak probes: explicit semantic errors whose *public* text carries
    # secrets, paths, a traceback and media; the sanitizer must strip them.
    {
        "stage": 1,
        "marker": "@leakclient",
        "action": "raise",
        "exception": "vllm.exceptions:VLLMValidationError",
        "args": [LEAK_TEXT],
        "kwargs": {"parameter": "prompt", "value": "sk-live-REJECTEDVALUE"},
    },
    {
        "stage": 2,
        "marker": "@leaktalk",
        "action": "raise",
        "exception": "vllm_omni.errors:OmniServiceUnavailableError",
        "args": [LEAK_TEXT],
    },
    {
        "stage": 5,
        "marker": "@vleak",
        "action": "raise",
        "exception": "vllm.exceptions:VLLMUnprocessableEntityError",
        "args": [LEAK_TEXT],
        "kwargs": {"parameter": "prompt", "value": "sk-live-REJECTEDVALUE"},
    },
]


def write_pipeline(
    directory: Path,
    *,
    stages: list[dict[str, Any]] | None = None,
    faults: list[dict[str, Any]] | None = None,
    blocklist: tuple[str, ...] = ("forbidden-topic",),
) -> Path:
    path = directory / "pipeline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "omni-reference",
                "stages": stages if stages is not None else REFERENCE_STAGES,
                "guardrail": {"blocklist": list(blocklist)},
                "faults": faults if faults is not None else FAULTS,
            }
        )
    )
    return path


# The variable that marks a server's processes (see ``_spawn``).
SERVER_MARK = "VLLM_OMNI_TEST_SERVER"


@dataclass
class OmniServer:
    proc: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    api_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        # One client for every poll: a new one loads the CA bundle each time,
        # which costs a busy machine tens of milliseconds per poll.
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited early:\n{self.log()[-3000:]}")
                try:
                    if client.get(self.base_url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"server not ready:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, *patterns: str, within_s: float) -> None:
        """Wait until the log matches every one of the regular ``patterns``."""
        found = [re.compile(pattern) for pattern in patterns]
        deadline = time.monotonic() + within_s
        while not all(pattern.search(log := self.log()) for pattern in found):
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.05)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_server(
    directory: Path,
    pipeline: Path | str = "reference",
    *,
    api_key: str | None = None,
    error_mode: str = "strict",
    env: dict[str, str] | None = None,
    job_store: Path | None = None,
    extra_args: tuple[str, ...] = (),
    host: str = "127.0.0.1",
    command_prefix: tuple[str, ...] = (),
) -> OmniServer:
    """Spawn (without waiting for readiness: start several, then wait).

    ``host``: where it listens (a free port there is taken); ``command_prefix``
    runs it through another command (``ip netns exec NS``: on a test host).
    """
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port(host) if not command_prefix else free_port()
    argv = [
        *command_prefix,
        sys.executable,
        "-m",
        "vllm_omni.entrypoints.cli.main",
        "serve",
        "--pipeline",
        str(pipeline),
        "--host",
        host,
        "--port",
        str(port),
        "--error-mode",
        error_mode,
        "--job-store",
        str(job_store or directory / "jobs.sqlite3"),
    ]
    if api_key:
        argv += ["--api-key", api_key]
    argv += extra_args
    return _spawn(directory, argv, host, port, env, api_key)


def _spawn(
    directory: Path,
    argv: list[str],
    host: str,
    port: int,
    env: dict[str, str] | None,
    api_key: str | None = None,
) -> OmniServer:
    """Run ``argv`` with its output in ``directory/server-PORT.log``; every
    process it starts inherits ``SERVER_MARK`` set to that log's path, so a
    test finds the server's processes wherever they are parented (a Ray
    worker is the raylet's child)."""
    log_path = directory / f"server-{port}.log"
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {}), SERVER_MARK: str(log_path)},
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return OmniServer(proc, f"http://{host}:{port}", log_path, api_key)


def start_command(
    directory: Path,
    command: Sequence[str],
    *args: str,
    env: dict[str, str] | None = None,
    job_store: bool = True,
) -> OmniServer:
    """Spawn a server the way an operator types it (``vllm serve MODEL
    --omni …``, ``vllm-omni serve MODEL …``), on a free loopback port with a
    private job store (``job_store=False``: upstream's ``vllm serve``, which
    has none); ``command`` is the console script and its subcommand.
    Without waiting for readiness."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [*command, *args, "--host", "127.0.0.1", "--port", str(port)]
    if job_store:
        argv += ["--job-store", str(directory / f"jobs-{port}.sqlite3")]
    return _spawn(directory, argv, "127.0.0.1", port, env)


@dataclass
class Background:
    """A command started without waiting for it, its output in files (a pipe
    nobody reads could fill and block it)."""

    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def result(self, timeout: float = 300.0) -> tuple[int, str, str]:
        """Wait for it: exit status, stdout, stderr."""
        code = self.proc.wait(timeout=timeout)
        return code, self.stdout.read_text(), self.stderr.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_in_background(
    directory: Path, name: str, *argv: str, env: dict[str, str] | None = None
) -> Background:
    """Start ``argv`` (its output in ``directory/name.out`` and ``.err``), so
    that several commands that import vLLM (seconds of CPU each) can run side
    by side; ``result`` waits for it. ``env``: its whole environment."""
    directory.mkdir(parents=True, exist_ok=True)
    stdout, stderr = directory / f"{name}.out", directory / f"{name}.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
    return Background(proc, stdout, stderr)


def console_script(name: str) -> str:
    """The installed console script ``name`` of this interpreter's environment."""
    return str(Path(sys.executable).with_name(name))
