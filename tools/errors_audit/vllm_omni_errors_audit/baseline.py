"""The baseline ratchet: the accepted finding sites, which may only go away.

Owns the JSON file (version 2)::

    {"tool": "vllm-omni errors audit", "version": 2,
     "sites": [{"fingerprint": "3f0c...", "rule": "OMNI001",
                "path": "entrypoints/serve.py", "scope": "Server.start",
                "line": 120}]}

A site is identified by its fingerprint (``runner.fingerprint``: rule, file
relative to the project root, enclosing qualified name, normalized
statement), not by its line, so moving code or editing other code keeps it.
``compare`` lists the current findings that are not in the baseline (the run
fails, even if another site was fixed) and the baseline sites that are gone
(the file can be tightened). A baseline is never widened by a tool run: an
update that would add a site is refused.

Version 1 files held counts per rule and folder; they are still read, compared
by counts, and converted to sites by ``--update-baseline`` when no count grew.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_omni_errors_audit.rules import RULES_BY_ID
from vllm_omni_errors_audit.runner import Report, ReportedFinding
from vllm_omni_errors_audit.usage import AuditUsageError

Counts = dict[str, dict[str, int]]
_TOOL = "vllm-omni errors audit"
_VERSION = 2
_SITE_KEYS = frozenset({"fingerprint", "rule", "path", "scope", "line"})


@dataclass(frozen=True, slots=True)
class Site:
    """One accepted finding site."""

    fingerprint: str
    rule: str
    path: str
    scope: str
    line: int


@dataclass(frozen=True, slots=True)
class Baseline:
    """A loaded baseline: sites (version 2) or, from a version 1 file, counts."""

    sites: dict[str, Site] | None
    counts: Counts | None

    @property
    def legacy(self) -> bool:
        return self.sites is None


@dataclass(frozen=True, slots=True)
class Change:
    """One (rule, folder) count that differs from a version 1 baseline."""

    rule: str
    folder: str
    before: int
    after: int

    def __str__(self) -> str:
        delta = self.after - self.before
        return (
            f"{self.rule} in {self.folder}: {self.before} -> {self.after} ({delta:+d})"
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    """New findings (fail the run) and fixed sites (tighten the baseline)."""

    new: list[ReportedFinding]
    fixed: list[Site]
    # Version 1 baselines only: the counts that grew and fell.
    grown: list[Change]
    fallen: list[Change]


def load_baseline(path: Path) -> Baseline:
    """Read a baseline; a missing or malformed file is a usage error."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise AuditUsageError(
            f"baseline {path} does not exist; create it with --update-baseline"
        ) from exc
    except OSError as exc:
        raise AuditUsageError(f"cannot read baseline {path}: {exc.strerror}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AuditUsageError(f"baseline {path} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise AuditUsageError(f"baseline {path} must be a JSON object")
    if "sites" in document:
        return Baseline(sites=_sites(path, document["sites"]), counts=None)
    return Baseline(sites=None, counts=_counts(path, document.get("counts")))


def compare(baseline: Baseline, report: Report) -> Comparison:
    findings = report.findings
    if baseline.sites is not None:
        current = {finding.fingerprint for finding in findings}
        return Comparison(
            new=[f for f in findings if f.fingerprint not in baseline.sites],
            fixed=sorted(
                (s for s in baseline.sites.values() if s.fingerprint not in current),
                key=lambda s: (s.path, s.line, s.rule),
            ),
            grown=[],
            fallen=[],
        )
    old = baseline.counts or {}
    now = report.counts()
    keys = {
        (rule, folder)
        for counts in (old, now)
        for rule, by_folder in counts.items()
        for folder in by_folder
    }
    changes = [
        Change(
            rule,
            folder,
            old.get(rule, {}).get(folder, 0),
            now.get(rule, {}).get(folder, 0),
        )
        for rule, folder in sorted(keys)
    ]
    grown = [c for c in changes if c.after > c.before]
    grown_keys = {(c.rule, c.folder) for c in grown}
    return Comparison(
        # Counts cannot say which site is new: every site of a grown
        # (rule, folder) is a candidate.
        new=[f for f in findings if (f.rule, f.folder) in grown_keys],
        fixed=[],
        grown=grown,
        fallen=[c for c in changes if c.after < c.before],
    )


def check_writable(path: Path) -> None:
    """Fail before the audit runs if ``path`` can never be written."""
    parent = path.parent
    if not parent.is_dir():
        raise AuditUsageError(f"cannot write baseline {path}: {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AuditUsageError(f"cannot write baseline {path}: {parent} is read-only")


def write_baseline(path: Path, findings: Sequence[ReportedFinding]) -> None:
    sites = sorted(
        (
            {
                "fingerprint": f.fingerprint,
                "rule": f.rule,
                "path": f.relative,
                "scope": f.scope,
                "line": f.line,
            }
            for f in findings
        ),
        key=lambda site: (site["path"], site["line"], site["rule"]),
    )
    document = {"tool": _TOOL, "version": _VERSION, "sites": sites}
    try:
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise AuditUsageError(f"cannot write baseline {path}: {exc.strerror}") from exc


def _sites(path: Path, items: object) -> dict[str, Site]:
    shape = f"baseline {path}: 'sites' must be a list of {sorted(_SITE_KEYS)} objects"
    if not isinstance(items, list):
        raise AuditUsageError(shape)
    sites: dict[str, Site] = {}
    for item in items:
        if (
            not isinstance(item, dict)
            or set(item) != _SITE_KEYS
            or item["rule"] not in RULES_BY_ID
            or type(item["line"]) is not int
            or not all(isinstance(item[key], str) for key in _SITE_KEYS - {"line"})
        ):
            raise AuditUsageError(shape)
        sites[item["fingerprint"]] = Site(**item)
    return sites


def _counts(path: Path, counts: object) -> Counts:
    if not isinstance(counts, dict) or not all(
        rule in RULES_BY_ID
        and isinstance(by_folder, dict)
        and all(
            isinstance(folder, str) and type(n) is int and n >= 0
            for folder, n in by_folder.items()
        )
        for rule, by_folder in counts.items()
    ):
        raise AuditUsageError(
            f"baseline {path} must be {{'sites': [...]}} (version 2) or "
            "{'counts': {rule id: {folder: count}}} (version 1)"
        )
    return counts
