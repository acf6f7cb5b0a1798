"""Our own tree passes the audit with an empty allowlist (docs/design.md §8).

The same gate runs in CI as ``.ci/audit-self``; a failure here lists each
finding as ``path:line:col: RULE name: message [suggest: Type]``.
"""

from __future__ import annotations

from audit_testing import RunCli


def test_vllm_omni_has_no_findings(run_cli: RunCli) -> None:
    done = run_cli("vllm_omni", "--format", "text")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("audited ")
    assert " 0 findings" in done.stdout
