"""The offline API in a caller's own script, the way a new user runs it.

The example of ``docs/errors/python.md`` (taken from the doc, so the test
follows the doc) runs as a plain top-level script with no ``__main__`` guard
and through standard input: stage processes must never re-run the caller's
main module. The caller's stderr gets no INFO line and no traceback unless
the caller configured logging, and no helper process outlives ``close()``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.e2e.omni_server import Background

ROOT = Path(__file__).resolve().parents[2]
PYTHON_DOC = ROOT / "docs" / "errors" / "python.md"
_TIMEOUT_S = 240


def _doc_example() -> tuple[str, str]:
    """The first ``python`` block of the doc and the output the doc shows."""
    text = PYTHON_DOC.read_text()
    example = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    output = re.search(r"It prints:\n\n```text\n(.*?)```", text, re.DOTALL)
    assert example and output, "docs/errors/python.md lost its example"
    return example.group(1), output.group(1)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _start(argv: list[str], cwd: Path, stdin: str | None = None) -> Background:
    """Start ``argv`` in ``cwd`` (``stdin``: its standard input), its output
    in files; ``Background.result`` waits for it."""
    stdout, stderr = cwd / "stdout.txt", cwd / "stderr.txt"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=_env(),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    if stdin is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    return Background(proc, stdout, stderr)


@pytest.fixture(scope="module")
def doc_example_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Background]]:
    """The doc's example as a plain script and through standard input,
    started together when the first of their tests starts (each imports
    vLLM and starts the reference stages: seconds of CPU); each test waits
    for its own."""
    example, _ = _doc_example()
    runs: dict[str, Background] = {}
    try:
        for how in ("script", "stdin"):
            directory = tmp_path_factory.mktemp(f"doc-example-{how}")
            if how == "script":
                script = directory / "example.py"
                script.write_text(example)
                runs[how] = _start([sys.executable, str(script)], directory)
            else:
                runs[how] = _start([sys.executable, "-"], directory, stdin=example)
        yield runs
    finally:
        for run in runs.values():
            run.stop()


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_python_doc_example_runs_as_a_plain_script(
    how: str, doc_example_runs: dict[str, Background]
) -> None:
    example, documented = _doc_example()
    assert 'if __name__ == "__main__"' not in example
    code, stdout, stderr = doc_example_runs[how].result(timeout=_TIMEOUT_S)
    assert code == 0, stderr[-3000:]
    assert stdout == documented
    # Nobody configured logging: no stage INFO line, no traceback.
    assert " INFO " not in stderr and "Traceback" not in stderr, stderr


_CONFIGURED = """
import json, logging, time
import psutil
logging.basicConfig(level=logging.INFO)
from vllm_omni import Omni
omni = Omni(pipeline="reference")
out = omni.generate("forbidden-topic", raise_on_error=False)
print(out.request_id, out.details.error_type, flush=True)
print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]))
omni.close()
print("closed", flush=True)
time.sleep(30)
"""

_STAMPED = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO stage-0 \[(?P<rid>[^\]]+)\] "
    r"stage 0 request (?P=rid) failed \(GuardrailViolationError 400\)$"
)


def test_logging_config_is_followed_and_no_helper_outlives_close(
    tmp_path: Path,
) -> None:
    """With ``logging`` configured, stage lines carry a timestamp, the stage id
    and the request id; 2 s after ``close()`` no helper process is left."""
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-"],
            cwd=tmp_path,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(_CONFIGURED)
    proc.stdin.close()
    try:
        request_id, error_type = proc.stdout.readline().split()
        helpers = json.loads(proc.stdout.readline())
        # The launcher and five reference stages: the guardrail runs in the
        # engine's process (vllm_omni.engine.inline).
        assert len(helpers) == 6, helpers
        assert proc.stdout.readline().strip() == "closed"
        time.sleep(2.0)
        assert [pid for pid in helpers if _running(pid)] == []
    finally:
        proc.kill()
        proc.wait()
    assert error_type == "GuardrailViolationError"
    lines = stderr_path.read_text().splitlines()
    # A stage writes its line whole, but it may follow the progress bar
    # ("Processed prompts", redrawn with "\r") on the terminal's line.
    lines = [line.rsplit("it/s]", 1)[-1] for line in lines]
    stamped = [m for m in map(_STAMPED.match, lines) if m]
    assert [m["rid"] for m in stamped] == [request_id], lines[-40:]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
