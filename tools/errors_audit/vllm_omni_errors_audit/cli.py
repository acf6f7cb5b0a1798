"""The ``vllm-omni errors audit`` command (also ``python -m vllm_omni_errors_audit``).

Owns the options, where output goes, the baseline ratchet's messages and the
exit status. ``vllm_omni.entrypoints.cli.main`` dispatches here; nothing on
this path imports vLLM, torch or FastAPI.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_omni_errors_audit.allowlist import load_allowlist
from vllm_omni_errors_audit.baseline import (
    Baseline,
    check_writable,
    compare,
    load_baseline,
    write_baseline,
)
from vllm_omni_errors_audit.cache import ScanCache, default_cache_dir
from vllm_omni_errors_audit.formats import (
    FORMATS,
    SARIF_MAX_RESULTS,
    TOOL_NAME,
    render_sarif_with_summary,
)
from vllm_omni_errors_audit.rules import RULES
from vllm_omni_errors_audit.runner import Report, scan_tree
from vllm_omni_errors_audit.usage import AuditUsageError

if TYPE_CHECKING:
    from vllm_omni_errors_audit import migrate

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

_EPILOG = f"""\
exit status:
  {EXIT_CLEAN}  clean: no findings (with --baseline: no site outside the baseline)
  {EXIT_FINDINGS}  findings; with --baseline: a site that is not in the baseline
     (even if another was fixed); with --update-baseline: refused for that
  {EXIT_USAGE}  usage or configuration error: bad option, missing path or root,
     malformed allowlist or baseline, baseline not writable
  {EXIT_INTERNAL}  internal error of the audit itself (a bug: please report it)

Files the audit cannot read, decode or parse are OMNI000 findings (exit 1),
never a crash.

rules:
{chr(10).join(f"  {rule.id} {rule.name}: {rule.summary}" for rule in RULES)}

Migration guide: docs/errors/migration.md
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=TOOL_NAME,
        description=(
            "Inventory raise sites by exception and folder, and find error "
            "handling that decides HTTP statuses outside vllm_omni.errors."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    parser.add_argument(
        "--root",
        metavar="DIR",
        help=(
            "project root: folder labels, baseline keys and SARIF paths are "
            "relative to it (default: the deepest folder holding every PATH)"
        ),
    )
    parser.add_argument("--format", choices=sorted(FORMATS), default="text")
    parser.add_argument(
        "--allowlist",
        type=Path,
        metavar="FILE",
        help="TOML: [[allow]] rule, path, reason",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="JSON of accepted finding sites; fail on any site not in it",
    )
    parser.add_argument(
        "--update-baseline",
        action="store_true",
        help="rewrite --baseline with the current sites (never adds one)",
    )
    parser.add_argument(
        "--sarif-max-results",
        type=_positive_int,
        default=SARIF_MAX_RESULTS,
        metavar="N",
        help=f"SARIF: keep at most N results (default {SARIF_MAX_RESULTS:,}, "
        "GitHub code scanning's limit per run)",
    )
    parser.add_argument(
        "--sarif-include-allowlisted",
        action="store_true",
        help="SARIF: also emit allowlisted findings, as suppressed results",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes for large cold runs (default: the core count)",
    )
    parser.add_argument(
        "--output", type=Path, metavar="FILE", help="write here, not stdout"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help=f"content-hash cache (default: {default_cache_dir()})",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write it"
    )
    parser.add_argument(
        "--fix",
        action="store_true",
        help="rewrite in place what needs no judgement (HTTPException with a "
        "literal status, error responses without their status, status-range "
        "guesses on a record); the report is of the tree after it",
    )
    parser.add_argument(
        "--suggest",
        action="store_true",
        help="write the rewrites that need a person (raw raises at request "
        "boundaries, broad excepts) as a unified diff for git apply, instead "
        "of the report; with --format sarif, every rewrite as a result's fixes",
    )
    parser.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="with --fix (or --suggest --format sarif): also the rewrites of "
        "those findings that may change what a client sees (a raise whose way "
        "to the response differs from HTTPException's, an error model a caller "
        "converts): each is listed as 'unsafe:' with why; review the diff",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # argparse itself exits 2 on a bad option, as EXIT_USAGE says.
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except AuditUsageError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except Exception as exc:
        # A bug in the audit, not in the audited tree or the command line:
        # its own status, so CI does not read it as "findings".
        _say(f"internal error: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        return EXIT_INTERNAL


def _run(args: argparse.Namespace) -> int:
    if args.update_baseline and args.baseline is None:
        raise AuditUsageError("--update-baseline needs --baseline FILE")
    if args.unsafe_fixes and not (
        args.fix or (args.suggest and args.format == "sarif")
    ):
        raise AuditUsageError(
            "--unsafe-fixes needs --fix (or --suggest --format sarif)"
        )
    if args.suggest and args.format not in ("text", "sarif"):
        raise AuditUsageError(
            "--suggest writes a patch (or, with --format sarif, SARIF fixes)"
        )
    allowlist = load_allowlist(args.allowlist) if args.allowlist else []
    creating = args.update_baseline and not args.baseline.exists()
    if args.update_baseline:
        check_writable(args.baseline)
    baseline = load_baseline(args.baseline) if args.baseline and not creating else None
    cache = None if args.no_cache else ScanCache(args.cache_dir or default_cache_dir())
    scanned = scan_tree(args.paths, jobs=args.jobs, cache=cache, root=args.root)
    report = scanned.report(allowlist)
    patch: bytes | None = None
    if args.fix or args.suggest:
        # LibCST and the rewrites load only here: a plain audit never pays.
        from vllm_omni_errors_audit import migrate

        if args.fix:
            fixed = migrate.fix(
                scanned, report, cache, jobs=args.jobs, unsafe=args.unsafe_fixes
            )
            report = scanned.report(allowlist)
            _tell(fixed, "fixed", report)
        if args.suggest:
            offered = migrate.suggest(
                scanned,
                report,
                offers=args.format == "sarif",
                jobs=args.jobs,
                unsafe=args.unsafe_fixes,
            )
            report.offers = offered.offers
            patch = None if args.format == "sarif" else offered.patch
            _tell(offered, "offered" if patch is None else "suggested", None)
    # The ratchet's verdict comes first: its lines name each new site before
    # thousands of lines of report.
    status = _verdict(args, report, baseline, creating=creating)
    if patch is None:
        _write(args.output, _render(args, report))
    else:
        _write_bytes(args.output, patch)
    for entry in report.unused_allowlist:
        _say(f"warning: allowlist entry {entry.rule} {entry.path!r} matched nothing")
    return status


def _tell(outcome: migrate.Outcome, verb: str, after: Report | None) -> None:
    """What a --fix or --suggest run did (the except clauses it widened
    too), and each site it left with why; after a fix, at the site's place
    in the fixed file."""
    where = f" in {len(outcome.files)} files" if verb != "offered" else ""
    left = "" if after is None else f"; {len(after.findings)} findings remain"
    _say(
        f"{verb} {len(outcome.done)} sites{where}{left}; "
        f"{len(outcome.skipped)} left for a person"
    )
    for clause in outcome.widened:
        _say(f"widened: {clause}", prefix=False)
    if verb == "fixed":
        # Where each was before the run (the finding is gone after it).
        for done in sorted(
            outcome.done, key=lambda d: (d.finding.path, d.finding.line)
        ):
            if done.kind == "unsafe":
                finding = done.finding
                _say(
                    f"unsafe: {finding.path}:{finding.line}:{finding.column} "
                    f"{finding.rule}: {done.description}",
                    prefix=False,
                )
    moved = {} if after is None else {f.fingerprint: f for f in after.findings}
    skipped = [
        (moved.get(skip.finding.fingerprint, skip.finding), skip.reason)
        for skip in outcome.skipped
    ]
    for finding, reason in sorted(skipped, key=lambda s: (s[0].path, s[0].line)):
        _say(
            f"not {verb}: {finding.path}:{finding.line}:{finding.column} "
            f"{finding.rule}: {reason}",
            prefix=False,
        )


def _render(args: argparse.Namespace, report: Report) -> str:
    if args.format == "sarif":
        text, omitted = render_sarif_with_summary(
            report,
            max_results=args.sarif_max_results,
            include_allowlisted=args.sarif_include_allowlisted,
        )
        if omitted:
            _say(f"SARIF: {omitted}")
        return text
    return FORMATS[args.format](report)


def _verdict(
    args: argparse.Namespace,
    report: Report,
    baseline: Baseline | None,
    *,
    creating: bool,
) -> int:
    if args.baseline is None:
        return EXIT_FINDINGS if report.findings else EXIT_CLEAN
    if creating or baseline is None:
        write_baseline(args.baseline, report.findings)
        _say(f"baseline {args.baseline} created with {len(report.findings)} sites")
        return EXIT_CLEAN
    return _ratchet(args.baseline, baseline, report, update=args.update_baseline)


def _ratchet(path: Path, baseline: Baseline, report: Report, *, update: bool) -> int:
    comparison = compare(baseline, report)
    for finding in comparison.new:
        _say(
            f"{finding.path}:{finding.line}:{finding.column} {finding.rule} "
            f"{finding.message}",
            prefix=False,
        )
    for change in comparison.grown:
        _say(f"grew: {change}")
    if comparison.new:
        what = (
            "sites in grown counts (a version 1 baseline cannot tell which is new)"
            if baseline.legacy
            else "new sites not in the baseline"
        )
        _say(f"{len(comparison.new)} {what} {path}")
        if update:
            _say(f"refusing to add sites to {path}; fix the new findings")
        return EXIT_FINDINGS
    for site in comparison.fixed:
        _say(
            f"tightenable: {site.path}:{site.line} {site.rule} in {site.scope} is fixed"
        )
    for change in comparison.fallen:
        _say(f"fell: {change}")
    tightenable = comparison.fixed or comparison.fallen
    if update and (tightenable or baseline.legacy):
        write_baseline(path, report.findings)
        converted = " (converted from counts to sites)" if baseline.legacy else ""
        _say(f"baseline {path} updated{converted}")
    elif tightenable:
        _say(f"run with --update-baseline to drop the fixed sites from {path}")
    elif baseline.legacy:
        _say(f"{path} holds counts; run with --update-baseline to convert it to sites")
    return EXIT_CLEAN


def _write(output: Path | None, text: str) -> None:
    # backslashreplace: a message may quote a string literal holding a lone
    # surrogate ("\ud800"), which UTF-8 cannot encode.
    _write_bytes(output, text.encode("utf-8", "backslashreplace"))


def _write_bytes(output: Path | None, data: bytes) -> None:
    if output is None:
        try:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            # ``audit ... | head``: the reader has gone; the exit status
            # still tells the verdict. Nothing more may reach the pipe.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise AuditUsageError(f"cannot write {output}: {exc}") from exc


def _say(message: str, *, prefix: bool = True) -> None:
    # Printable whatever the locale: a file name's undecodable bytes are
    # already escaped, but stderr may be ASCII.
    line = f"{TOOL_NAME}: {message}\n" if prefix else f"{message}\n"
    sys.stderr.flush()
    sys.stderr.buffer.write(line.encode("utf-8", "backslashreplace"))
    sys.stderr.buffer.flush()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
