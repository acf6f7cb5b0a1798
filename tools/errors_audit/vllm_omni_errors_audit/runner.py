"""Running an audit: which files, scanned how, aggregated into one report.

Owns file discovery (``*.py`` below each path, hidden folders and
``__pycache__`` skipped, symlinked folders followed once), the project root
and the top-level folder of each file relative to it (the RFC's inventory
columns), the content-hash cache lookups, the process pool, the
``vllm_omni/errors`` ownership exemption, site fingerprints, and the
allowlist. It renders nothing: ``formats`` does.

Whatever the walker meets that it cannot audit - an unreadable folder or
file, a FIFO or socket named ``*.py``, a broken link - becomes an OMNI000
finding at that path, and the rest is audited: a CI gate must never pass
because it saw nothing. Files are opened non-blocking and checked to be
regular before reading, so a FIFO cannot hang the run.

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
import stat
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from vllm_omni_errors_audit import rules
from vllm_omni_errors_audit.allowlist import AllowEntry
from vllm_omni_errors_audit.cache import ScanCache
from vllm_omni_errors_audit.scanner import FileResult, Finding, scan
from vllm_omni_errors_audit.usage import AuditUsageError

ROOT_FOLDER = "."
_PARALLEL_MIN_FILES = 32
_BATCH_FILES = 32


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One audited path: where it is, how it is shown, its inventory column."""

    path: Path
    # Relative to the current directory (absolute outside it), printable:
    # undecodable bytes of a file name are shown as ``\xff``.
    shown: str
    # Relative to the project root, ``/``-separated, printable: the key of
    # baselines and SARIF locations.
    relative: str
    folder: str
    # Inside vllm_omni/errors, where the owned_by_errors_package rules stop.
    owned: bool
    # Why this path cannot be audited (an OMNI000 finding), or None.
    problem: str | None = None
    # ``relative`` as a URI reference: the name's raw bytes percent-encoded.
    uri: str = ""


@dataclass(frozen=True, slots=True)
class ReportedFinding:
    """A finding at a reported path, with its site fingerprint."""

    rule: str
    path: str
    folder: str
    line: int
    column: int
    message: str
    suggestion: str
    relative: str = ""
    scope: str = ""
    fingerprint: str = ""
    uri: str = ""


@dataclass(frozen=True, slots=True)
class Replacement:
    """Text that replaces a region of a file: 1-based lines, 1-based columns
    in UTF-16 code units, the end exclusive (an empty region inserts)."""

    start_line: int
    start_column: int
    end_line: int
    end_column: int
    text: str


@dataclass(frozen=True, slots=True)
class Offer:
    """A rewrite of one finding, offered rather than applied (SARIF
    ``fixes``): complete on its own, its import included."""

    description: str
    # ``fix``: ``--fix`` applies it (it needs no judgement); ``unsafe``:
    # ``--fix --unsafe-fixes`` does (it may change a status); ``suggest``: a
    # ``--suggest`` rewrite.
    kind: str
    replacements: tuple[Replacement, ...]


@dataclass(slots=True)
class Report:
    """Everything an output format shows."""

    roots: list[str]
    root: str
    files: int
    folders: list[str]
    # exception name -> folder -> raise sites
    inventory: dict[str, Counter[str]]
    findings: list[ReportedFinding]
    allowlisted: list[tuple[ReportedFinding, AllowEntry]] = field(default_factory=list)
    unused_allowlist: list[AllowEntry] = field(default_factory=list)
    # Rewrites offered for findings, by fingerprint (``--suggest``).
    offers: dict[str, Offer] = field(default_factory=dict)

    def counts(self) -> dict[str, dict[str, int]]:
        """Findings per rule and folder (the baseline's numbers)."""
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for finding in self.findings:
            counts[finding.rule][finding.folder] += 1
        return {
            rule: dict(sorted(by_folder.items()))
            for rule, by_folder in sorted(counts.items())
        }


@dataclass(slots=True)
class Scanned:
    """A scanned tree: every file's result, before the report is built (the
    migration assistant replaces the results of the files it rewrote)."""

    roots: list[str]
    project: str
    files: list[SourceFile]
    results: list[FileResult]

    def report(self, allowlist: Sequence[AllowEntry] = ()) -> Report:
        return build_report(
            self.roots, self.project, self.files, self.results, allowlist
        )


def run_audit(
    paths: Sequence[str],
    *,
    jobs: int,
    cache: ScanCache | None,
    allowlist: Sequence[AllowEntry] = (),
    root: str | None = None,
    whole: bool = False,
) -> Report:
    """Audit ``paths`` (labelled relative to ``root``) and aggregate;
    ``whole`` parses every file whole instead of its skeleton (the reference
    the skeleton is tested against: same report, slower)."""
    scanned = scan_tree(paths, jobs=jobs, cache=cache, root=root, whole=whole)
    return scanned.report(allowlist)


def scan_tree(
    paths: Sequence[str],
    *,
    jobs: int,
    cache: ScanCache | None,
    root: str | None = None,
    whole: bool = False,
) -> Scanned:
    """Discover and scan ``paths``; ``run_audit`` without the report."""
    project, files = discover(paths, root=root)
    results = scan_files(files, jobs=jobs, cache=cache, whole=whole)
    return Scanned([_printable(path) for path in paths], project, files, results)


def project_root(paths: Sequence[str], root: str | None = None) -> str:
    """The declared ``root``, else the deepest folder holding every path.

    Labels and baseline keys are relative to it, so they do not depend on
    the order of the arguments, nor on which of them contains another.
    """
    if root is not None:
        if not os.path.isdir(root):
            raise AuditUsageError(f"--root {root} is not a directory")
        return os.path.abspath(root)
    folders = [
        path if os.path.isdir(path) else os.path.dirname(path)
        for path in (os.path.abspath(given) for given in paths)
    ]
    return os.path.commonpath(folders)


def discover(
    paths: Sequence[str], *, root: str | None = None
) -> tuple[str, list[SourceFile]]:
    """The project root, and the Python files below ``paths``, each once,
    sorted by their path relative to the root (problems included)."""
    for given in paths:
        if not os.path.lexists(given):
            raise AuditUsageError(f"no such file or directory: {given}")
    project = project_root(paths, root)
    walker = _Walker(project)
    for given in sorted({os.path.abspath(p) for p in paths}):
        if os.path.relpath(given, project).startswith(os.pardir):
            raise AuditUsageError(f"{given} is outside the project root {project}")
        walker.visit(given)
    return project, sorted(walker.files, key=lambda source: source.relative)


class _Walker:
    """A cycle-safe walk that follows symlinked folders once."""

    def __init__(self, project: str) -> None:
        # Every path is built by joining names below an absolute argument
        # inside the project, so prefixes give relative paths: resolving
        # thousands of paths one by one costs more than a warm run.
        self._project = os.path.join(project, "")
        self._cwd = os.path.join(os.getcwd(), "")
        self._seen: set[tuple[int, int]] = set()
        self.files: list[SourceFile] = []

    def visit(self, path: str) -> None:
        try:
            info = os.stat(path)
        except OSError as exc:
            self._add(path, _reason(exc, path))
            return
        if stat.S_ISDIR(info.st_mode):
            self._walk(path)
        else:
            self._file(path, info)

    def _walk(self, top: str) -> None:
        stack = [top]
        while stack:
            directory = stack.pop()
            try:
                info = os.stat(directory)
            except OSError as exc:
                self._add(directory, _reason(exc, directory))
                continue
            key = (info.st_dev, info.st_ino)
            if key in self._seen:
                continue  # a symlink cycle, or a folder reached twice
            self._seen.add(key)
            try:
                with os.scandir(directory) as entries:
                    children = sorted(entries, key=lambda e: e.name, reverse=True)
            except OSError as exc:
                self._add(directory, f"cannot read directory: {exc.strerror}")
                continue
            for entry in children:
                name = entry.name
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                if is_dir:
                    if not name.startswith(".") and name != "__pycache__":
                        stack.append(entry.path)
                elif name.endswith(".py"):
                    self.visit(entry.path)

    def _file(self, path: str, info: os.stat_result) -> None:
        key = (info.st_dev, info.st_ino)
        if key in self._seen:
            return
        self._seen.add(key)
        problem = None if stat.S_ISREG(info.st_mode) else "not a regular file"
        self._add(path, problem)

    def _add(self, path: str, problem: str | None) -> None:
        shown = path[len(self._cwd) :] if path.startswith(self._cwd) else path
        relative = path[len(self._project) :] if path != self._project[:-1] else "."
        parts = relative.split(os.sep)
        folder = parts[0] if len(parts) > 1 else ROOT_FOLDER
        self.files.append(
            SourceFile(
                Path(path),
                _printable(shown),
                _printable(relative),
                _printable(folder),
                _owned(path),
                problem,
                quote(os.fsencode(relative).replace(os.sep.encode(), b"/")),
            )
        )


def scan_files(
    files: Sequence[SourceFile],
    *,
    jobs: int,
    cache: ScanCache | None,
    whole: bool = False,
) -> list[FileResult]:
    """One result per file, from the cache where the bytes are known.

    With no cache, or an empty one (a cold run), nothing can be looked up:
    the files go straight to the scanners, which read and hash them anyway,
    instead of being read and hashed here first."""
    results: list[FileResult | None] = [None] * len(files)
    lookup = cache is not None and not cache.empty
    with _Dispatch(jobs, whole=whole) as dispatch:
        for index, source in enumerate(files):
            if source.problem is not None:
                results[index] = _unreadable(source.problem)
                continue
            if not lookup:
                dispatch.add(index, source.path)
                continue
            try:
                data = read_regular(source.path)
            except _Unreadable as exc:
                results[index] = _unreadable(exc.reason)
                continue
            cached = cache.get(_digest(data)) if cache is not None else None
            if cached is None:
                dispatch.add(index, source.path)
            else:
                results[index] = cached
        for index, digest, result in dispatch.results():
            results[index] = result
            if cache is not None and digest:
                cache.put(digest, result)
    if cache is not None:
        cache.save()
    return [result for result in results if result is not None]


def build_report(
    roots: list[str],
    project: str,
    files: Sequence[SourceFile],
    results: Sequence[FileResult],
    allowlist: Sequence[AllowEntry],
) -> Report:
    inventory: dict[str, Counter[str]] = defaultdict(Counter)
    report = Report(
        roots=roots,
        root=_printable(project),
        files=sum(1 for source in files if source.problem is None),
        folders=sorted({source.folder for source in files}),
        inventory=inventory,
        findings=[],
    )
    used: set[AllowEntry] = set()
    for source, result in zip(files, results, strict=True):
        for name, count in result.raises.items():
            inventory[name][source.folder] += count
        for _, reported in file_findings(source, result.findings):
            entry = next(
                (e for e in allowlist if e.matches(reported.rule, source.shown)), None
            )
            if entry is None:
                report.findings.append(reported)
            else:
                used.add(entry)
                report.allowlisted.append((reported, entry))
    report.unused_allowlist = [entry for entry in allowlist if entry not in used]
    return report


def file_findings(
    source: SourceFile, findings: Sequence[Finding]
) -> list[tuple[int, ReportedFinding]]:
    """The findings of one file that apply at its path (the ownership
    exemption), each with its index in ``findings`` and its fingerprint."""
    reported: list[tuple[int, ReportedFinding]] = []
    occurrences: Counter[tuple[str, str, str]] = Counter()
    for index, finding in enumerate(findings):
        if source.owned and rules.RULES_BY_ID[finding.rule].owned_by_errors_package:
            continue
        key = (finding.rule, finding.scope, finding.code)
        occurrences[key] += 1
        reported.append((index, _reported(source, finding, occurrences[key])))
    return reported


class _Dispatch:
    """Scans the files handed to it: in this process while they are few, in
    a process pool from ``_PARALLEL_MIN_FILES`` on. Files go to the pool in
    batches of ``_BATCH_FILES`` while the caller is still reading and hashing
    the rest (that overlaps), and the pool hands batches to whichever worker
    is free (that balances)."""

    def __init__(self, jobs: int, *, whole: bool) -> None:
        self._jobs = jobs
        self._whole = whole
        self._waiting: list[tuple[int, Path]] = []
        self._pool: ProcessPoolExecutor | None = None
        self._batches: list[tuple[list[int], Future[list[tuple[str, FileResult]]]]] = []

    def __enter__(self) -> _Dispatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def add(self, index: int, path: Path) -> None:
        self._waiting.append((index, path))
        if self._jobs <= 1:
            return
        started = self._pool is not None
        if len(self._waiting) >= (_BATCH_FILES if started else _PARALLEL_MIN_FILES):
            self._submit()

    def results(self) -> Iterator[tuple[int, str, FileResult]]:
        """(file index, digest, result) of every file added, in order."""
        if self._pool is None:
            indices = [index for index, _ in self._waiting]
            scanned = _scan_chunk(
                [path for _, path in self._waiting], whole=self._whole
            )
            batches = [(indices, scanned)]
        else:
            if self._waiting:
                self._submit()
            batches = [(indices, batch.result()) for indices, batch in self._batches]
        for indices, scanned in batches:
            for index, (digest, result) in zip(indices, scanned, strict=True):
                yield index, digest, result

    def _submit(self) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self._jobs)
        paths = [path for _, path in self._waiting]
        batch = self._pool.submit(_scan_chunk, paths, whole=self._whole)
        self._batches.append(([index for index, _ in self._waiting], batch))
        self._waiting = []


def _scan_chunk(
    paths: Sequence[Path], *, whole: bool = False
) -> list[tuple[str, FileResult]]:
    """Scan files (in a worker or here): (sha256 of the bytes read, result).

    The digest is of the bytes this call read, so a file edited since the
    main process hashed it is cached under its new content; "" when the file
    could not be read again (not cached)."""
    scanned: list[tuple[str, FileResult]] = []
    with _gc_paused():
        for path in paths:
            try:
                data = read_regular(path)
            except _Unreadable as exc:
                scanned.append(("", _unreadable(exc.reason)))
                continue
            scanned.append((_digest(data), scan(data, whole=whole)))
    return scanned


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


class _Unreadable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_regular(path: Path) -> bytes:
    """A regular file's bytes; never blocks on a FIFO or a device."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _Unreadable(_reason(exc, str(path))) from exc
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise _Unreadable("not a regular file")
        try:
            return handle.read()
        except OSError as exc:
            raise _Unreadable(f"cannot read: {exc.strerror}") from exc


def _reason(exc: OSError, path: str) -> str:
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return "broken symbolic link"
    if exc.errno is not None and exc.strerror:
        return f"cannot read: {exc.strerror}"
    return f"cannot read: {type(exc).__name__}"


def _printable(path: str) -> str:
    """``path`` as UTF-8-safe text: undecodable name bytes become ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace").replace(os.sep, "/")


def _owned(path: str) -> bool:
    parts = path.split(os.sep)
    package, module = rules.ERRORS_PACKAGE
    return any(
        parts[i] == package and parts[i + 1] in (module, f"{module}.py")
        for i in range(len(parts) - 1)
    )


def _reported(source: SourceFile, finding: Finding, occurrence: int) -> ReportedFinding:
    return ReportedFinding(
        rule=finding.rule,
        path=source.shown,
        folder=source.folder,
        line=finding.line,
        column=finding.column,
        message=finding.message,
        suggestion=finding.suggestion,
        relative=source.relative,
        uri=source.uri,
        scope=finding.scope,
        fingerprint=fingerprint(
            finding.rule, source.relative, finding.scope, finding.code, occurrence
        ),
    )


def fingerprint(rule: str, path: str, scope: str, code: str, occurrence: int) -> str:
    """A site's identity: rule, file (relative to the project root), enclosing
    qualified name, and the statement without whitespace; the n-th of
    identical statements in one scope is told apart by ``occurrence``. Line
    numbers are not part of it, so moving code does not make a site new."""
    key = "\0".join((rule, path, scope, code, str(occurrence)))
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def _unreadable(reason: str) -> FileResult:
    rule = rules.RULES_BY_ID[rules.PARSE_ERROR]
    return FileResult(findings=[Finding(rule.id, 1, 1, reason, rule.help)])


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
