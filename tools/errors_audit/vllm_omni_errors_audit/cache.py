"""The content-hash cache: unchanged files are not parsed again.

Owns one JSON file per audit version, mapping the sha256 of a file's bytes
to its ``FileResult``. The version is a hash of the scanner and rule sources
and the Python minor version (``ast`` differs between versions), so editing a
rule can never serve a stale result. Results do not depend on paths, so a
moved or copied file is a hit too. A missing, unreadable or corrupt cache is
an empty cache; writes go through a temporary file and ``os.replace`` so
concurrent audits never see half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from vllm_omni_errors_audit.scanner import FileResult
from vllm_omni_errors_audit.skeleton import _lexer

# Keep at most this many entries: the current run's, plus older ones while
# they fit (auditing two trees in turn stays warm for both).
_MAX_ENTRIES = 200_000
_VERSIONED_SOURCES = ("scanner.py", "skeleton.py", "rules.py", "cache.py")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/vllm-omni/audit`` (``~/.cache`` when unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "vllm-omni" / "audit"


def audit_version() -> str:
    """A hash of everything that decides a file's result: the sources, and
    the C lexer's build where there is one (its tables must equal the
    tokenizer's, but a result is never served from another lexer's run)."""
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    here = Path(__file__).parent
    for name in _VERSIONED_SOURCES:
        digest.update((here / name).read_bytes())
    lexer = getattr(_lexer, "__file__", None)
    digest.update(Path(lexer).read_bytes() if lexer else b"no C lexer")
    return digest.hexdigest()[:16]


class ScanCache:
    """Results by content hash, loaded once and saved once per run."""

    def __init__(self, directory: Path) -> None:
        self._file = directory / f"scan-{audit_version()}.json"
        self._old: dict[str, list[object]] = self._load()
        self._used: dict[str, list[object]] = {}
        self._added = False

    @property
    def empty(self) -> bool:
        """Whether the cache holds no result (no lookup can hit)."""
        return not self._old

    def get(self, digest: str) -> FileResult | None:
        entry = self._old.get(digest)
        if entry is None:
            return None
        try:
            result = FileResult.from_json(entry)
        except (TypeError, ValueError):
            return None
        self._used[digest] = entry
        return result

    def put(self, digest: str, result: FileResult) -> None:
        self._used[digest] = result.to_json()
        self._added = True

    def save(self) -> None:
        if not self._added:
            return
        entries = dict(self._used)
        for digest, entry in self._old.items():
            if len(entries) >= _MAX_ENTRIES:
                break
            entries.setdefault(digest, entry)
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self._file.parent, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                # ``dumps`` encodes in C; ``dump`` writes chunk by chunk from
                # Python, several times slower on the cold run's 5,000 files.
                stream.write(json.dumps(entries, separators=(",", ":")))
            os.replace(temporary, self._file)
        except OSError as exc:
            # A read-only cache directory slows the next run down; it must not
            # fail this one.
            sys.stderr.write(f"vllm-omni errors audit: cache not saved: {exc}\n")

    def _load(self) -> dict[str, list[object]]:
        try:
            entries = json.loads(self._file.read_bytes())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}
