"""Running an audit: which files, scanned how, aggregated into one report.

Owns file discovery (``*.py`` below each path, hidden folders and
``__pycache__`` skipped), the top-level folder of each file (the RFC's
inventory columns), the content-hash cache lookups, the process pool, the
``vllm_omni/errors`` ownership exemption, and the allowlist. It renders
nothing: ``formats`` does.

A process pool pays for itself only past a few dozen files to parse. Measured
on the 2-core reference machine (fork start method, files of the 0.30 wheel):
10 files take 21 ms in this process and 22 ms with two workers, 50 files
105 ms and 71 ms, 400 files 0.88 s and 0.61 s. So runs with fewer than
``_PARALLEL_MIN_FILES`` files to parse (every warm run among them) stay in
this process.
"""

from __future__ import annotations

import gc
import hashlib
import os
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from vllm_omni.errors.audit import rules
from vllm_omni.errors.audit.allowlist import AllowEntry
from vllm_omni.errors.audit.cache import ScanCache
from vllm_omni.errors.audit.scanner import FileResult, Finding, scan
from vllm_omni.errors.audit.usage import AuditUsageError

ROOT_FOLDER = "."
_PARALLEL_MIN_FILES = 32
_CHUNKS_PER_JOB = 4


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One audited file: where it is, how it is shown, its inventory column."""

    path: Path
    shown: str
    folder: str
    # Inside vllm_omni/errors, where the owned_by_errors_package rules stop.
    owned: bool


@dataclass(frozen=True, slots=True)
class ReportedFinding:
    """A finding at a reported path."""

    rule: str
    path: str
    folder: str
    line: int
    column: int
    message: str
    suggestion: str


@dataclass(slots=True)
class Report:
    """Everything an output format shows."""

    roots: list[str]
    files: int
    folders: list[str]
    # exception name -> folder -> raise sites
    inventory: dict[str, Counter[str]]
    findings: list[ReportedFinding]
    allowlisted: list[tuple[ReportedFinding, AllowEntry]] = field(default_factory=list)
    unused_allowlist: list[AllowEntry] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """Findings per rule and folder (the baseline's numbers)."""
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for finding in self.findings:
            counts[finding.rule][finding.folder] += 1
        return {
            rule: dict(sorted(by_folder.items()))
            for rule, by_folder in sorted(counts.items())
        }


def run_audit(
    paths: Sequence[str],
    *,
    jobs: int,
    cache: ScanCache | None,
    allowlist: Sequence[AllowEntry] = (),
) -> Report:
    """Audit ``paths`` and aggregate the results."""
    files = discover(paths)
    results = scan_files(files, jobs=jobs, cache=cache)
    return build_report(list(paths), files, results, allowlist)


def discover(paths: Sequence[str]) -> list[SourceFile]:
    """The Python files below ``paths``, each once, in a stable order.

    Each root is resolved once and its files are joined to it as strings:
    resolving 1,600 paths one by one costs more than scanning a warm tree.
    """
    cwd = os.path.join(os.path.realpath(os.getcwd()), "")
    files: list[SourceFile] = []
    seen: set[str] = set()
    for given in paths:
        root = os.path.realpath(given)
        if os.path.isfile(root):
            found = [(root, ROOT_FOLDER)]
        elif os.path.isdir(root):
            found = _python_files(root)
        else:
            raise AuditUsageError(f"no such file or directory: {given}")
        for path, folder in found:
            if path not in seen:
                seen.add(path)
                shown = path[len(cwd) :] if path.startswith(cwd) else path
                files.append(
                    SourceFile(
                        Path(path), shown.replace(os.sep, "/"), folder, _owned(path)
                    )
                )
    return files


def scan_files(
    files: Sequence[SourceFile], *, jobs: int, cache: ScanCache | None
) -> list[FileResult]:
    """One result per file, from the cache where the bytes are known."""
    results: list[FileResult | None] = []
    pending: list[tuple[int, Path, int]] = []
    for index, source in enumerate(files):
        try:
            data = source.path.read_bytes()
        except OSError as exc:
            results.append(_unreadable(exc))
            continue
        cached = cache.get(_digest(data)) if cache is not None else None
        results.append(cached)
        if cached is None:
            pending.append((index, source.path, len(data)))
    scanned = _scan_pending([(path, size) for _, path, size in pending], jobs)
    for (index, _, _), (digest, result) in zip(pending, scanned, strict=True):
        results[index] = result
        if cache is not None and digest:
            cache.put(digest, result)
    if cache is not None:
        cache.save()
    return [result for result in results if result is not None]


def build_report(
    roots: list[str],
    files: Sequence[SourceFile],
    results: Sequence[FileResult],
    allowlist: Sequence[AllowEntry],
) -> Report:
    inventory: dict[str, Counter[str]] = defaultdict(Counter)
    report = Report(
        roots=roots,
        files=len(files),
        folders=sorted({source.folder for source in files}),
        inventory=inventory,
        findings=[],
    )
    used: set[AllowEntry] = set()
    for source, result in zip(files, results, strict=True):
        for name, count in result.raises.items():
            inventory[name][source.folder] += count
        for finding in result.findings:
            if source.owned and rules.RULES_BY_ID[finding.rule].owned_by_errors_package:
                continue
            reported = _reported(source, finding)
            entry = next(
                (e for e in allowlist if e.matches(finding.rule, source.shown)), None
            )
            if entry is None:
                report.findings.append(reported)
            else:
                used.add(entry)
                report.allowlisted.append((reported, entry))
    report.unused_allowlist = [entry for entry in allowlist if entry not in used]
    return report


def _scan_pending(
    pending: list[tuple[Path, int]], jobs: int
) -> list[tuple[str, FileResult]]:
    if jobs <= 1 or len(pending) < _PARALLEL_MIN_FILES:
        return _scan_chunk([path for path, _ in pending])
    chunks = _balanced_chunks(pending, jobs * _CHUNKS_PER_JOB)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(_scan_chunk, [chunk for _, chunk in chunks]))
    ordered: list[tuple[str, FileResult] | None] = [None] * len(pending)
    for (positions, _), results in zip(chunks, done, strict=True):
        for position, result in zip(positions, results, strict=True):
            ordered[position] = result
    return [result for result in ordered if result is not None]


def _scan_chunk(paths: Sequence[Path]) -> list[tuple[str, FileResult]]:
    """Scan files (in a worker or here): (sha256 of the bytes read, result).

    The digest is of the bytes this call read, so a file edited since the
    main process hashed it is cached under its new content; "" when the file
    could not be read again (not cached)."""
    scanned: list[tuple[str, FileResult]] = []
    with _gc_paused():
        for path in paths:
            try:
                data = path.read_bytes()
            except OSError as exc:
                scanned.append(("", _unreadable(exc)))
                continue
            scanned.append((_digest(data), scan(data)))
    return scanned


def _balanced_chunks(
    pending: list[tuple[Path, int]], count: int
) -> list[tuple[list[int], list[Path]]]:
    """Split into ``count`` chunks of similar byte size, largest files first."""
    order = sorted(range(len(pending)), key=lambda i: -pending[i][1])
    chunks: list[tuple[list[int], list[Path]]] = [([], []) for _ in range(count)]
    sizes = [0] * count
    for position in order:
        path, size = pending[position]
        smallest = sizes.index(min(sizes))
        chunks[smallest][0].append(position)
        chunks[smallest][1].append(path)
        sizes[smallest] += size + 1
    return [chunk for chunk in chunks if chunk[1]]


@contextmanager
def _gc_paused() -> Iterator[None]:
    # ASTs have no reference cycles, so the cyclic collector only burns time
    # (about 15% of parsing) on the millions of nodes allocated and freed.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _python_files(root: str) -> list[tuple[str, str]]:
    """(path, top-level folder) of the ``*.py`` files below ``root``."""
    found: list[tuple[str, str]] = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(
            d for d in subdirs if not d.startswith(".") and d != "__pycache__"
        )
        relative = os.path.relpath(directory, root)
        folder = ROOT_FOLDER if relative == os.curdir else relative.split(os.sep)[0]
        found.extend(
            (os.path.join(directory, name), folder)
            for name in sorted(names)
            if name.endswith(".py")
        )
    return found


def _owned(path: str) -> bool:
    parts = path.split(os.sep)
    package, module = rules.ERRORS_PACKAGE
    return any(
        parts[i] == package and parts[i + 1] in (module, f"{module}.py")
        for i in range(len(parts) - 1)
    )


def _reported(source: SourceFile, finding: Finding) -> ReportedFinding:
    return ReportedFinding(
        rule=finding.rule,
        path=source.shown,
        folder=source.folder,
        line=finding.line,
        column=finding.column,
        message=finding.message,
        suggestion=finding.suggestion,
    )


def _unreadable(exc: OSError) -> FileResult:
    rule = rules.RULES_BY_ID[rules.PARSE_ERROR]
    return FileResult(
        findings=[Finding(rule.id, 1, 1, f"cannot read: {exc.strerror}", rule.help)]
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
