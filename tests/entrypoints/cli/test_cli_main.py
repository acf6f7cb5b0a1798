"""The ``vllm-omni`` dispatcher without the audit installed.

The audit is a tool of its own (``tools/errors_audit``); its tests run the
command through this dispatcher with the tool installed
(``tools/errors_audit/tests/test_audit_cli.py``). Here its import is blocked
(``None`` in ``sys.modules``) in a fresh interpreter.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
INSTALL = "pip install -c requirements/lock.txt -e tools/errors_audit"


def _vllm_omni(blocked: str, *args: str) -> subprocess.CompletedProcess[str]:
    probe = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"
        "from vllm_omni.entrypoints.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_the_audit_one_line_says_how_to_install_it() -> None:
    done = _vllm_omni("vllm_omni_errors_audit", "errors", "audit", "vllm_omni")
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("vllm-omni errors audit: not installed")
    assert line.endswith(f"from a vllm-omni checkout: {INSTALL}")


def test_a_module_missing_inside_the_audit_is_not_reported_as_the_audit() -> None:
    if importlib.util.find_spec("vllm_omni_errors_audit") is None:
        pytest.skip("the audit is not installed (tools/errors_audit)")
    done = _vllm_omni("vllm_omni_errors_audit.usage", "errors", "audit", "--help")
    assert done.returncode == 1
    assert "not installed" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "ModuleNotFoundError: import of vllm_omni_errors_audit.usage halted; "
        "None in sys.modules"
    )
