"""The baseline ratchet: finding counts per rule and folder may only fall.

Owns the JSON file::

    {"tool": "vllm-omni errors audit", "version": 1,
     "counts": {"OMNI001": {"entrypoints": 12, "stages": 3}}}

``compare`` says which counts grew (the run fails) and which fell (the file
can be tightened). ``update`` rewrites the file with the current counts only
when none grew: a baseline is never raised by a tool run, only by a reviewed
edit. A file that does not exist yet is created by ``update``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.errors.audit.rules import RULES_BY_ID
from vllm_omni.errors.audit.usage import AuditUsageError

Counts = dict[str, dict[str, int]]
_TOOL = "vllm-omni errors audit"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Change:
    """One (rule, folder) count that differs from the baseline."""

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
    grown: list[Change]
    fallen: list[Change]


def load_baseline(path: Path) -> Counts:
    """Read a baseline; a missing or malformed file is a usage error."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise AuditUsageError(
            f"baseline {path} does not exist; create it with --update-baseline"
        ) from exc
    except OSError as exc:
        raise AuditUsageError(f"cannot read baseline {path}: {exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AuditUsageError(f"baseline {path} is not valid JSON: {exc}") from exc
    counts = document.get("counts") if isinstance(document, dict) else None
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
            f"baseline {path} must be {{'counts': {{rule id: {{folder: count}}}}}}"
        )
    return counts


def compare(baseline: Counts, current: Counts) -> Comparison:
    keys = {
        (rule, folder)
        for counts in (baseline, current)
        for rule, by_folder in counts.items()
        for folder in by_folder
    }
    changes = [
        Change(
            rule,
            folder,
            baseline.get(rule, {}).get(folder, 0),
            current.get(rule, {}).get(folder, 0),
        )
        for rule, folder in sorted(keys)
    ]
    return Comparison(
        grown=[c for c in changes if c.after > c.before],
        fallen=[c for c in changes if c.after < c.before],
    )


def write_baseline(path: Path, counts: Counts) -> None:
    document = {"tool": _TOOL, "version": _VERSION, "counts": counts}
    path.write_text(
        json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
