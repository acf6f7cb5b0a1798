"""The ``vllm-omni errors audit`` command (also ``python -m vllm_omni.errors.audit``).

Owns the options, where output goes, the baseline ratchet's messages and the
exit status. ``vllm_omni.entrypoints.cli.main`` dispatches here; nothing on
this path imports vLLM, torch or FastAPI.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_omni.errors.audit.allowlist import load_allowlist
from vllm_omni.errors.audit.baseline import compare, load_baseline, write_baseline
from vllm_omni.errors.audit.cache import ScanCache, default_cache_dir
from vllm_omni.errors.audit.formats import FORMATS, TOOL_NAME
from vllm_omni.errors.audit.rules import RULES
from vllm_omni.errors.audit.runner import Report, run_audit
from vllm_omni.errors.audit.usage import AuditUsageError

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

_EPILOG = f"""\
exit status:
  {EXIT_CLEAN}  clean: no findings (with --baseline: no count grew)
  {EXIT_FINDINGS}  findings; with --baseline: a count per rule and folder grew;
     with --update-baseline: refused because a count grew
  {EXIT_USAGE}  usage error: bad option, missing path, malformed allowlist or
     baseline (an allowlist entry without a reason is one)

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
        help="JSON counts per rule and folder; fail only when one grows",
    )
    parser.add_argument(
        "--update-baseline",
        action="store_true",
        help="rewrite --baseline with the current counts (never raises a count)",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except AuditUsageError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    if args.update_baseline and args.baseline is None:
        raise AuditUsageError("--update-baseline needs --baseline FILE")
    allowlist = load_allowlist(args.allowlist) if args.allowlist else []
    creating = args.update_baseline and not args.baseline.exists()
    baseline = load_baseline(args.baseline) if args.baseline and not creating else None
    cache = None if args.no_cache else ScanCache(args.cache_dir or default_cache_dir())
    report = run_audit(args.paths, jobs=args.jobs, cache=cache, allowlist=allowlist)
    _write(args.output, FORMATS[args.format](report))
    for entry in report.unused_allowlist:
        _say(f"warning: allowlist entry {entry.rule} {entry.path!r} matched nothing")
    if args.baseline is None:
        return EXIT_FINDINGS if report.findings else EXIT_CLEAN
    if creating:
        write_baseline(args.baseline, report.counts())
        _say(f"baseline {args.baseline} created with {len(report.findings)} findings")
        return EXIT_CLEAN
    return _ratchet(args.baseline, baseline or {}, report, update=args.update_baseline)


def _ratchet(
    path: Path, baseline: dict[str, dict[str, int]], report: Report, *, update: bool
) -> int:
    comparison = compare(baseline, report.counts())
    for change in comparison.grown:
        _say(f"grew: {change}")
    if comparison.grown:
        if update:
            _say(f"refusing to raise counts in {path}; fix the new findings")
        return EXIT_FINDINGS
    for change in comparison.fallen:
        _say(f"fell: {change}")
    if update and comparison.fallen:
        write_baseline(path, report.counts())
        _say(f"baseline {path} updated")
    elif comparison.fallen:
        _say(f"run with --update-baseline to lock in the lower counts in {path}")
    return EXIT_CLEAN


def _write(output: Path | None, text: str) -> None:
    data = text.encode("utf-8")
    if output is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise AuditUsageError(f"cannot write {output}: {exc}") from exc


def _say(message: str) -> None:
    sys.stderr.write(f"{TOOL_NAME}: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
