"""The migration assistant: ``--fix`` and ``--suggest`` over an audited tree.

Owns the run: which files have findings to rewrite (reported ones only, so
an allowlisted site is never touched, and only below the paths given), the
plan of each (``rewrite``), performing it (``codemod``), and the checks a
rewritten file passes before anything is written or offered: it compiles,
and audited again, exactly the rewritten findings are gone and no finding
is new. A set of rewrites that fails the checks is retried one rewrite at a
time; a rewrite that fails alone is left, with the reason. Before any
plan, ``flow`` follows each HTTPException site's exception through its
package: its verdict decides the site, and the except clauses it must
widen are widened in their own files' edits (a run that could not widen
one writes nothing). ``--fix`` writes
the files in place (atomically, through the link of a linked file);
``--suggest`` writes nothing and returns a unified diff (``git apply``
reads it), or, for SARIF, each finding's rewrite as an offer.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_omni_errors_audit import flow, rules
from vllm_omni_errors_audit.cache import ScanCache
from vllm_omni_errors_audit.rewrite import (
    KIND_RULES,
    Clause,
    FilePlan,
    Kind,
    ModelIndex,
    Rewrite,
    Skip,
    Way,
    Widen,
    plan_file,
)
from vllm_omni_errors_audit.runner import (
    Offer,
    Report,
    ReportedFinding,
    Scanned,
    SourceFile,
    _digest,
    _gc_paused,
    _Unreadable,
    file_findings,
    read_regular,
)
from vllm_omni_errors_audit.scanner import FileResult, scan
from vllm_omni_errors_audit.usage import AuditUsageError

if TYPE_CHECKING:
    from vllm_omni_errors_audit import codemod

_LINES = re.compile(rb"(?<=\n)")


@dataclass(frozen=True, slots=True)
class Done:
    """A finding rewritten (``--fix``) or offered (``--suggest``)."""

    finding: ReportedFinding
    description: str
    # ``unsafe``: a rewrite that may change a status (``--unsafe-fixes``).
    kind: Kind = "fix"


@dataclass(slots=True)
class Outcome:
    """What a run rewrote (or offered), what it left, and why."""

    done: list[Done] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    files: list[SourceFile] = field(default_factory=list)
    patch: bytes = b""
    offers: dict[str, Offer] = field(default_factory=dict)
    # ``path:line:column except ...`` of each clause --fix widened, where
    # it is in the fixed file.
    widened: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _FileOutcome:
    """One file's part of an ``Outcome``; picklable (no syntax trees)."""

    index: int
    done: list[Done] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    # The rewritten file and its audit, when anything was rewritten.
    data: bytes | None = None
    result: FileResult | None = None
    patch: bytes = b""
    offers: dict[str, Offer] = field(default_factory=dict)
    widened: list[str] = field(default_factory=list)
    unwidened: list[str] = field(default_factory=list)


def fix(
    scanned: Scanned,
    report: Report,
    cache: ScanCache | None,
    *,
    jobs: int,
    unsafe: bool = False,
) -> Outcome:
    """Apply the rewrites that need no judgement, in place (with ``unsafe``,
    also those that may change a status a client sees); ``scanned`` then
    holds the rewritten files' results (rebuild the report from it)."""
    outcome = Outcome()
    kinds: frozenset[Kind] = frozenset({"fix", "unsafe"} if unsafe else {"fix"})
    parts = _each_file(scanned, report, kinds, jobs, _fix_file)
    unwidened = [problem for part in parts for problem in part.unwidened]
    if unwidened:
        # Rewrites in other files count on these clauses: write nothing.
        raise AuditUsageError(f"--fix cannot widen {unwidened[0]}; nothing was written")
    for part in parts:
        _merge(outcome, part)
        outcome.widened += part.widened
        if part.data is None or part.result is None:
            continue
        source = scanned.files[part.index]
        _write(source.path, part.data)
        scanned.results[part.index] = part.result
        outcome.files.append(source)
        if cache is not None:
            cache.put(_digest(part.data), part.result)
    if cache is not None:
        cache.save()
    return outcome


def suggest(
    scanned: Scanned,
    report: Report,
    *,
    offers: bool,
    jobs: int,
    unsafe: bool = False,
) -> Outcome:
    """The rewrites that need a person, as a unified diff; with ``offers``,
    instead every finding's rewrite (every kind; unsafe fixes with
    ``unsafe``) as a SARIF offer."""
    outcome = Outcome()
    kinds: frozenset[Kind] = frozenset({"suggest"})
    if offers:
        kinds |= {"fix", "unsafe"} if unsafe else {"fix"}
    task = _offer_file if offers else _suggest_file
    patch: list[bytes] = []
    for part in _each_file(scanned, report, kinds, jobs, task):
        _merge(outcome, part)
        outcome.offers.update(part.offers)
        if part.patch:
            patch.append(part.patch)
            outcome.files.append(scanned.files[part.index])
    outcome.patch = b"".join(patch)
    return outcome


def unified_diff(label: bytes, old: bytes, new: bytes) -> bytes:
    """A ``git apply``-able unified diff of one file (``a/``, ``b/``
    prefixes; a last line without a line break is marked as such)."""
    lines = difflib.diff_bytes(
        difflib.unified_diff,
        [line for line in _LINES.split(old) if line],
        [line for line in _LINES.split(new) if line],
        fromfile=b"a/" + label,
        tofile=b"b/" + label,
    )
    return b"".join(
        line if line.endswith(b"\n") else line + b"\n\\ No newline at end of file\n"
        for line in lines
        if line
    )


_Task = Callable[[FilePlan, str], _FileOutcome]


def _each_file(
    scanned: Scanned,
    report: Report,
    kinds: frozenset[Kind],
    jobs: int,
    task: _Task,
) -> list[_FileOutcome]:
    """``task`` on the plan of every file with findings of the rules
    ``kinds`` rewrite, in a process pool when there are several. With
    ``--fix``, where each HTTPException goes is followed first (``flow``,
    here, through its whole package: the verdict decides the site, and the
    clauses to widen may be in other files); the files that cannot depend
    on it are planned in the pool meanwhile."""
    wanted = frozenset().union(*(KIND_RULES[kind] for kind in kinds))
    by_file: dict[str, list[ReportedFinding]] = defaultdict(list)
    for finding in report.findings:
        if finding.rule in wanted:
            by_file[finding.relative].append(finding)
    traced = "fix" in kinds and any(
        f.rule == rules.HTTP_EXC for findings in by_file.values() for f in findings
    )
    early = [
        (index, source)
        for index, source in enumerate(scanned.files)
        if source.relative in by_file
        and not (traced and _may_need_trace(source, by_file[source.relative]))
    ]
    pooled = jobs >= 2 and len(by_file) >= 2
    with ProcessPoolExecutor(max_workers=jobs) if pooled else nullcontext() as pool:
        started = [
            _start(pool, index, source, by_file[source.relative], kinds, task, scanned)
            for index, source in _largest_first(early)
        ]
        if not traced:
            return _in_order(started)
        paths = {source.relative: source.path for source in scanned.files}
        ways = flow.trace(
            [
                (finding, paths[finding.relative])
                for findings in by_file.values()
                for finding in findings
                if finding.rule == rules.HTTP_EXC
            ],
            [source.path for source in scanned.files if source.problem is None],
        )
        widen: dict[Path, set[Clause]] = defaultdict(set)
        for way in ways.values():
            if way.blocked is None:
                for clause in way.widen:
                    widen[clause.path].add(clause)
        done = {index for index, _ in early}
        late = [
            (index, source)
            for index, source in enumerate(scanned.files)
            if index not in done
            and (source.relative in by_file or flow.absolute(source.path) in widen)
        ]
        for index, source in _largest_first(late):
            findings = by_file.get(source.relative, [])
            started.append(
                _start(
                    pool,
                    index,
                    source,
                    findings,
                    kinds,
                    task,
                    scanned,
                    {
                        f.fingerprint: ways[f.fingerprint]
                        for f in findings
                        if f.fingerprint in ways
                    },
                    sorted(widen.get(flow.absolute(source.path), ())),
                )
            )
        return _in_order(started)


def _may_need_trace(source: SourceFile, findings: list[ReportedFinding]) -> bool:
    """Whether ``flow``'s verdict may change this file's plan: it has an
    HTTPException site, or names HTTPException (only such a file can hold
    a clause to widen: an alias or a module-level tuple is written there)."""
    if any(finding.rule == rules.HTTP_EXC for finding in findings):
        return True
    try:
        return b"HTTPException" in read_regular(source.path)
    except _Unreadable:
        return True


def _largest_first(
    files: list[tuple[int, SourceFile]],
) -> list[tuple[int, SourceFile]]:
    # In a pool, the last task is then a short one.
    return sorted(files, key=lambda item: -_size(item[1].path))


def _start(
    pool: ProcessPoolExecutor | None,
    index: int,
    source: SourceFile,
    findings: list[ReportedFinding],
    kinds: frozenset[Kind],
    task: _Task,
    scanned: Scanned,
    ways: dict[str, Way] | None = None,
    widen: list[Clause] | None = None,
) -> Future[_FileOutcome] | _FileOutcome:
    """One file's plan and task: submitted to ``pool``, or run here."""
    arguments = (
        index,
        source,
        findings,
        kinds,
        task,
        scanned.project,
        ways,
        widen or [],
    )
    if pool is None:
        return _plan_and_run(*arguments)
    return pool.submit(_plan_and_run, *arguments)


def _in_order(started: list[Future[_FileOutcome] | _FileOutcome]) -> list[_FileOutcome]:
    """The outcomes in the files' order (the order the report lists)."""
    parts = [part.result() if isinstance(part, Future) else part for part in started]
    return sorted(parts, key=lambda part: part.index)


def _plan_and_run(
    index: int,
    source: SourceFile,
    findings: list[ReportedFinding],
    kinds: frozenset[Kind],
    task: _Task,
    project: str,
    ways: dict[str, Way] | None,
    widen: list[Clause],
) -> _FileOutcome:
    with _gc_paused():
        planned = plan_file(source, findings, kinds, ModelIndex(), ways, widen)
        if isinstance(planned, list):
            return _FileOutcome(
                index, skipped=planned, unwidened=[clause.shown for clause in widen]
            )
        part = task(planned, project)
    part.index = index
    part.skipped[:0] = planned.skipped
    return part


def _fix_file(plan: FilePlan, project: str) -> _FileOutcome:
    part = _FileOutcome(0, unwidened=list(plan.unwidened))
    if plan.rewrites or plan.widen:
        done, checked = _perform(plan, plan.rewrites, part)
        if checked is not None:
            part.done = done
            part.data, part.result = checked.data, checked.result
            part.widened = _widened(plan, checked.changes)
        elif plan.widen:
            part.unwidened += [
                f"{widen.clause.shown}: the file fails the checks"
                for widen in plan.widen
            ]
    return part


def _widened(plan: FilePlan, changes: Sequence[codemod.Edit]) -> list[str]:
    """Each widened clause as ``path:line:column except ...``, at its place
    in the fixed file."""
    from vllm_omni_errors_audit import codemod  # LibCST: in the worker

    old = codemod.Text(plan.text)
    new = codemod.Text(codemod.apply(plan.text, changes))
    shown = []
    for widen in plan.widen:
        offset = old.offset(widen.clause.line, widen.clause.column)
        line, _ = new.position(codemod.moved(plan.text, changes, offset))
        caught = widen.clause.shown.rpartition(": ")[2].rstrip(")")
        shown.append(
            f"{plan.source.shown}:{line}:{widen.clause.column + 1} {caught}: "
            f"{rules.FIX_BASE} joins it, so the rewritten raises take it as "
            "HTTPException did"
        )
    return shown


def _suggest_file(plan: FilePlan, project: str) -> _FileOutcome:
    part = _fix_file(plan, project)
    if part.data is not None:
        part.patch = unified_diff(_label(plan.source, project), plan.data, part.data)
        part.data = part.result = None
    return part


def _offer_file(plan: FilePlan, project: str) -> _FileOutcome:
    """Each rewrite alone, checked, as a SARIF offer (the imports it needs
    included; none removed, since the other offers may still use them)."""
    from vllm_omni_errors_audit import codemod  # LibCST: in the worker

    part = _FileOutcome(0)
    widen = {widen.clause: widen for widen in plan.widen}
    for rewrite in plan.rewrites:
        elsewhere = sorted(c.shown for c in rewrite.needs if c not in widen)
        if elsewhere:
            part.skipped.append(
                Skip(
                    rewrite.finding,
                    f"it needs {elsewhere[0]} widened too, which a fix of one "
                    "file cannot carry: --fix does both",
                )
            )
            continue
        needs = [widen[clause] for clause in sorted(rewrite.needs)]
        checked = _check(plan, [rewrite], unbind=False, widen=needs)
        if isinstance(checked, str):
            part.skipped.append(Skip(rewrite.finding, checked))
            continue
        changes = checked.changes
        part.offers[rewrite.finding.fingerprint] = Offer(
            rewrite.description, rewrite.kind, codemod.replacements(plan, changes)
        )
        part.done.append(Done(rewrite.finding, rewrite.description, rewrite.kind))
    return part


def _merge(outcome: Outcome, part: _FileOutcome) -> None:
    outcome.done += part.done
    outcome.skipped += part.skipped


@dataclass(frozen=True, slots=True)
class _Checked:
    """A rewritten file that passed the checks: its bytes, its audit, and
    the edits that made it."""

    data: bytes
    result: FileResult
    changes: list[codemod.Edit]


def _perform(
    plan: FilePlan, rewrites: Sequence[Rewrite], part: _FileOutcome
) -> tuple[list[Done], _Checked | None]:
    """The rewrites that pass the checks and the file they make (with the
    file's clauses to widen, always): all at once, else those that pass
    alone, if they also pass together."""
    checked = _check(plan, rewrites, widen=plan.widen)
    if isinstance(checked, str):
        kept = []
        for rewrite in rewrites:
            alone = _check(plan, [rewrite], widen=plan.widen)
            if isinstance(alone, str):
                part.skipped.append(Skip(rewrite.finding, alone))
            else:
                kept.append(rewrite)
        checked = (
            _check(plan, kept, widen=plan.widen)
            if kept or plan.widen
            else "nothing left to rewrite"
        )
        if isinstance(checked, str):
            part.skipped += [Skip(r.finding, checked) for r in kept]
            return [], None
        rewrites = kept
    return [Done(r.finding, r.description, r.kind) for r in rewrites], checked


def _check(
    plan: FilePlan,
    rewrites: Sequence[Rewrite],
    *,
    unbind: bool = True,
    widen: Sequence[Widen] = (),
) -> _Checked | str:
    """The rewritten file and its audit, or why it fails the checks."""
    from vllm_omni_errors_audit import codemod  # LibCST: in the worker

    try:
        changes = codemod.edits(plan, rewrites, unbind=unbind, widen=widen)
        data = codemod.apply(plan.text, changes).encode(plan.encoding)
    except codemod.RewriteError as exc:
        return str(exc)
    except UnicodeEncodeError as exc:
        return f"the rewrite cannot be written as {plan.encoding}: {exc.reason}"
    try:
        # Byte-compiling (no syntax tree objects) costs half a parse; the
        # audit then reads the file's skeleton, as every audit does.
        compile(data, str(plan.source.path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"the rewritten file does not compile: {exc}"
    result = scan(data)
    expected = plan.fingerprints - {r.finding.fingerprint for r in rewrites}
    found = {f.fingerprint for _, f in file_findings(plan.source, result.findings)}
    if found != expected:
        return (
            f"audited again, the rewritten file would have {len(found - expected)} "
            f"new finding(s) and keep {len(expected - found)} it should not"
            if found - expected
            else "audited again, the rewritten file loses a finding it should keep"
        )
    return _Checked(data, result, changes)


def _label(source: SourceFile, project: str) -> bytes:
    """The path a patch names: relative to the current directory, where
    ``git apply`` runs, or else to the project root."""
    path = os.path.abspath(source.path)
    relative = os.path.relpath(path)
    if relative.startswith(os.pardir):
        relative = os.path.relpath(path, project)
    return os.fsencode(relative).replace(os.sep.encode(), b"/")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _write(path: Path, data: bytes) -> None:
    """Replace the file's bytes atomically, keeping its mode; a symbolic
    link stays a link (its target is rewritten)."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
        handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.chmod(temporary, mode)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise AuditUsageError(f"cannot write {path}: {exc.strerror}") from exc
