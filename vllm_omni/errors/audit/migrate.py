"""The migration assistant: ``--fix`` and ``--suggest`` over an audited tree.

Owns the run: which files have findings to rewrite (reported ones only, so
an allowlisted site is never touched, and only below the paths given), the
plan of each (``rewrite``), performing it (``codemod``), and the checks a
rewritten file passes before anything is written or offered: it compiles,
and audited again, exactly the rewritten findings are gone and no finding
is new. A set of rewrites that fails the checks is retried one rewrite at a
time; a rewrite that fails alone is left, with the reason. ``--fix`` writes
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllm_omni.errors.audit import codemod
from vllm_omni.errors.audit.cache import ScanCache
from vllm_omni.errors.audit.rewrite import (
    KIND_RULES,
    FilePlan,
    Kind,
    ModelIndex,
    Rewrite,
    Skip,
    plan_file,
)
from vllm_omni.errors.audit.runner import (
    Offer,
    Report,
    ReportedFinding,
    Scanned,
    SourceFile,
    _digest,
    file_findings,
)
from vllm_omni.errors.audit.scanner import FileResult, scan
from vllm_omni.errors.audit.usage import AuditUsageError

_LINES = re.compile(rb"(?<=\n)")


@dataclass(slots=True)
class Outcome:
    """What a run rewrote (or offered), what it left, and why."""

    done: list[Rewrite] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    files: list[SourceFile] = field(default_factory=list)
    patch: bytes = b""
    offers: dict[str, Offer] = field(default_factory=dict)


def fix(scanned: Scanned, report: Report, cache: ScanCache | None) -> Outcome:
    """Apply the rewrites that need no judgement, in place; ``scanned``
    then holds the rewritten files' results (rebuild the report from it)."""
    outcome = Outcome()
    for index, plan in _plans(scanned, report, frozenset({"fix"}), outcome):
        done, checked = _perform(plan, plan.rewrites, outcome)
        if checked is None:
            continue
        data, result = checked
        _write(plan.source.path, data)
        scanned.results[index] = result
        if cache is not None:
            cache.put(_digest(data), result)
        outcome.done += done
        outcome.files.append(plan.source)
    if cache is not None:
        cache.save()
    return outcome


def suggest(scanned: Scanned, report: Report, *, offers: bool) -> Outcome:
    """The rewrites that need a person, as a unified diff; with ``offers``,
    instead every finding's rewrite (both kinds) as a SARIF offer."""
    outcome = Outcome()
    kinds: frozenset[Kind] = frozenset({"suggest", "fix"} if offers else {"suggest"})
    patch: list[bytes] = []
    for _, plan in _plans(scanned, report, kinds, outcome):
        if offers:
            _offer(plan, outcome)
            continue
        done, checked = _perform(plan, plan.rewrites, outcome)
        if checked is None:
            continue
        outcome.done += done
        outcome.files.append(plan.source)
        patch.append(
            unified_diff(_label(plan.source, scanned.project), plan.data, checked[0])
        )
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


def _plans(
    scanned: Scanned, report: Report, kinds: frozenset[Kind], outcome: Outcome
) -> list[tuple[int, FilePlan]]:
    """The plan of every file with findings of the rules ``kinds`` rewrite;
    files that cannot be planned add their skips to ``outcome``."""
    wanted = frozenset().union(*(KIND_RULES[kind] for kind in kinds))
    by_file: dict[str, list[ReportedFinding]] = defaultdict(list)
    for finding in report.findings:
        if finding.rule in wanted:
            by_file[finding.relative].append(finding)
    models = ModelIndex()
    plans = []
    for index, source in enumerate(scanned.files):
        findings = by_file.get(source.relative)
        if not findings:
            continue
        planned = plan_file(source, findings, kinds, models)
        if isinstance(planned, list):
            outcome.skipped += planned
            continue
        outcome.skipped += planned.skipped
        if planned.rewrites:
            plans.append((index, planned))
    return plans


def _perform(
    plan: FilePlan, rewrites: Sequence[Rewrite], outcome: Outcome
) -> tuple[list[Rewrite], tuple[bytes, FileResult] | None]:
    """The rewrites that pass the checks and the file they make: all at
    once, else those that pass alone, if they also pass together."""
    checked = _check(plan, rewrites)
    if not isinstance(checked, str):
        return list(rewrites), checked
    kept = []
    for rewrite in rewrites:
        alone = _check(plan, [rewrite])
        if isinstance(alone, str):
            outcome.skipped.append(Skip(rewrite.finding, alone))
        else:
            kept.append(rewrite)
    together = _check(plan, kept) if kept else "nothing left to rewrite"
    if isinstance(together, str):
        outcome.skipped += [Skip(r.finding, together) for r in kept]
        return [], None
    return kept, together


def _check(
    plan: FilePlan, rewrites: Sequence[Rewrite], *, unbind: bool = True
) -> tuple[bytes, FileResult] | str:
    """The rewritten file and its audit, or why it fails the checks."""
    try:
        changes = codemod.edits(plan, rewrites, unbind=unbind)
        data = codemod.apply(plan.text, changes).encode(plan.encoding)
    except codemod.RewriteError as exc:
        return str(exc)
    except UnicodeEncodeError as exc:
        return f"the rewrite cannot be written as {plan.encoding}: {exc.reason}"
    try:
        compile(data, str(plan.source.path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
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
    return data, result


def _offer(plan: FilePlan, outcome: Outcome) -> None:
    """Each rewrite alone, checked, as a SARIF offer (imports it needs
    included; none removed, since the other offers may still use them)."""
    for rewrite in plan.rewrites:
        checked = _check(plan, [rewrite], unbind=False)
        if isinstance(checked, str):
            outcome.skipped.append(Skip(rewrite.finding, checked))
            continue
        changes = codemod.edits(plan, [rewrite], unbind=False)
        outcome.offers[rewrite.finding.fingerprint] = Offer(
            rewrite.description,
            rewrite.kind == "fix",
            codemod.replacements(plan, changes),
        )
        outcome.done.append(rewrite)


def _label(source: SourceFile, project: str) -> bytes:
    """The path a patch names: relative to the current directory, where
    ``git apply`` runs, or else to the project root."""
    path = os.path.abspath(source.path)
    relative = os.path.relpath(path)
    if relative.startswith(os.pardir):
        relative = os.path.relpath(path, project)
    return os.fsencode(relative).replace(os.sep.encode(), b"/")


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
