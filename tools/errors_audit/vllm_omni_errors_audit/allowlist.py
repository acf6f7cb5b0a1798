"""The allowlist: findings accepted on purpose, each with a reason.

Owns reading and matching the TOML file::

    [[allow]]
    rule = "OMNI001"
    path = "vllm_omni/stages/video/*.py"
    reason = "shape checks on model output; never reached by request input"

``path`` is an ``fnmatch`` glob over the reported path (relative to the
current directory, ``/``-separated; ``*`` also matches ``/``). Every entry
needs all three keys and a non-empty reason; anything else is a usage error,
so an allowlist can never silently widen.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from vllm_omni_errors_audit.rules import RULES_BY_ID
from vllm_omni_errors_audit.usage import AuditUsageError

_KEYS = frozenset({"rule", "path", "reason"})


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One accepted (rule, path glob) pair and why."""

    rule: str
    path: str
    reason: str

    def matches(self, rule: str, path: str) -> bool:
        return rule == self.rule and fnmatchcase(path, self.path)


def load_allowlist(path: Path) -> list[AllowEntry]:
    """Read and validate an allowlist file."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AuditUsageError(f"cannot read allowlist {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AuditUsageError(f"allowlist {path} is not valid TOML: {exc}") from exc
    unknown = set(document) - {"allow"}
    if unknown:
        raise AuditUsageError(
            f"allowlist {path}: unknown top-level keys {sorted(unknown)}; "
            "use [[allow]] tables"
        )
    entries = document.get("allow", [])
    if not isinstance(entries, list):
        raise AuditUsageError(f"allowlist {path}: 'allow' must be an array of tables")
    return [_entry(path, index, item) for index, item in enumerate(entries, start=1)]


def _entry(path: Path, index: int, item: object) -> AllowEntry:
    where = f"allowlist {path}, entry {index}"
    if not isinstance(item, dict):
        raise AuditUsageError(f"{where}: must be a table")
    missing = sorted(_KEYS - set(item))
    extra = sorted(set(item) - _KEYS)
    if missing or extra:
        raise AuditUsageError(f"{where}: missing keys {missing}, unknown keys {extra}")
    if not all(isinstance(item[key], str) for key in _KEYS):
        raise AuditUsageError(f"{where}: rule, path and reason must be strings")
    if not item["reason"].strip():
        raise AuditUsageError(f"{where}: the reason must not be empty")
    if item["rule"] not in RULES_BY_ID:
        raise AuditUsageError(
            f"{where}: unknown rule {item['rule']!r}; known: {sorted(RULES_BY_ID)}"
        )
    return AllowEntry(rule=item["rule"], path=item["path"], reason=item["reason"])
