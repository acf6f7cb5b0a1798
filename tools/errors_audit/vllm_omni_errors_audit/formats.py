"""Output formats of the audit: text, JSON, Markdown and SARIF 2.1.0.

Owns how a ``Report`` is shown, nothing else: every number comes from the
report, every rule text from ``rules.RULES``. ``FORMATS`` maps a format name
to its renderer. Markdown reproduces the RFC's inventory table (raise sites
by exception name, one column per top-level folder, and the total); SARIF is
what GitHub code scanning ingests (URIs relative to the project root under
``%SRCROOT%``, 1-based columns in UTF-16 code units, each site's fingerprint
as a partial fingerprint). GitHub keeps 5,000 results per run, so SARIF keeps
at most ``max_results`` (errors first) and leaves allowlisted findings out
unless asked; what was cut is said in the run's properties. With ``--suggest``, a result
whose finding has a rewrite carries it as a SARIF ``fix``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from vllm_omni_errors_audit import __version__
from vllm_omni_errors_audit.rules import (
    DOCS_URI,
    RULES,
    RULES_BY_ID,
    Rule,
    exception_kind,
)
from vllm_omni_errors_audit.runner import Offer, Report, ReportedFinding

TOOL_NAME = "vllm-omni errors audit"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_MAX_RESULTS = 5_000
_LEVEL_ORDER = {"error": 0, "warning": 1, "note": 2}
_SRCROOT = "%SRCROOT%"
_TEXT_INVENTORY_TOP = 8


def render_text(report: Report) -> str:
    lines = [
        f"{f.path}:{f.line}:{f.column}: {f.rule} {RULES_BY_ID[f.rule].name}: "
        f"{f.message} [suggest: {f.suggestion}]"
        for f in report.findings
    ]
    by_rule = Counter(f.rule for f in report.findings)
    per_rule = ", ".join(f"{rule} {n}" for rule, n in sorted(by_rule.items()))
    summary = f"audited {report.files} files: {len(report.findings)} findings"
    if per_rule:
        summary += f" ({per_rule})"
    if report.allowlisted:
        summary += f", {len(report.allowlisted)} allowlisted"
    lines.append(summary)
    top = _inventory_rows(report)[:_TEXT_INVENTORY_TOP]
    if top:
        lines.append(
            "raise sites: " + ", ".join(f"{name} {total}" for name, total, _ in top)
        )
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    document = {
        "tool": TOOL_NAME,
        "version": __version__,
        "roots": report.roots,
        "files": report.files,
        "folders": report.folders,
        "inventory": {
            name: {
                "kind": exception_kind(name),
                "total": total,
                "folders": dict(sorted(by_folder.items())),
            }
            for name, total, by_folder in _inventory_rows(report)
        },
        "counts": report.counts(),
        "findings": [_finding_json(f) for f in report.findings],
        "allowlisted": [
            {**_finding_json(f), "reason": entry.reason}
            for f, entry in report.allowlisted
        ],
        "rules": [
            {"id": rule.id, "name": rule.name, "summary": rule.summary}
            for rule in RULES
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def render_markdown(report: Report) -> str:
    roots = ", ".join(f"`{root}`" for root in report.roots)
    out = [
        f"# {TOOL_NAME}",
        "",
        f"{report.files:,} files audited under {roots}: "
        f"{len(report.findings):,} findings, {len(report.allowlisted):,} allowlisted.",
        "",
        "## Raise sites by exception",
        "",
    ]
    rows = _inventory_rows(report)
    folders = _columns(report.folders, (by_folder for _, _, by_folder in rows))
    out += _table(
        ["exception", "kind", *(_folder_heading(f) for f in folders), "total"],
        [
            [
                f"`{name}`",
                exception_kind(name),
                *(_count(by_folder[f]) for f in folders),
                f"{total:,}",
            ]
            for name, total, by_folder in rows
        ],
        numeric_from=2,
    )
    counts = report.counts()
    folders = _columns(
        report.folders, (Counter(by_folder) for by_folder in counts.values())
    )
    out += ["", "## Findings by rule", ""]
    out += _table(
        ["rule", "name", *(_folder_heading(f) for f in folders), "total"],
        [
            [
                rule.id,
                rule.name,
                *(_count(counts.get(rule.id, {}).get(f, 0)) for f in folders),
                f"{sum(counts.get(rule.id, {}).values()):,}",
            ]
            for rule in RULES
        ],
        numeric_from=2,
    )
    for rule in RULES:
        found = [f for f in report.findings if f.rule == rule.id]
        if not found:
            continue
        out += ["", f"### {rule.id} {rule.name} ({len(found):,})", "", rule.help, ""]
        out += [
            f"- `{f.path}:{f.line}:{f.column}` {f.message}; suggested: `{f.suggestion}`"
            for f in found
        ]
    return "\n".join(out) + "\n"


def render_sarif(report: Report) -> str:
    """SARIF with the defaults: at most 5,000 results, none allowlisted."""
    return render_sarif_with_summary(report)[0]


def render_sarif_with_summary(
    report: Report,
    *,
    max_results: int = SARIF_MAX_RESULTS,
    include_allowlisted: bool = False,
) -> tuple[str, str]:
    """The SARIF log, and a sentence saying what was left out ("" if none)."""
    index = {rule.id: position for position, rule in enumerate(RULES)}
    candidates = [(f, None) for f in report.findings]
    if include_allowlisted:
        candidates += [(f, entry.reason) for f, entry in report.allowlisted]
    candidates.sort(
        key=lambda item: (
            item[1] is not None,
            _LEVEL_ORDER[RULES_BY_ID[item[0].rule].level],
            item[0].relative,
            item[0].line,
            item[0].column,
        )
    )
    kept = candidates[:max_results]
    dropped = Counter(finding.rule for finding, _ in candidates[max_results:])
    allowlisted_left_out = 0 if include_allowlisted else len(report.allowlisted)
    results = []
    for finding, reason in kept:
        result = _sarif_result(finding, index)
        if reason is not None:
            result["suppressions"] = [{"kind": "external", "justification": reason}]
        offer = report.offers.get(finding.fingerprint)
        if offer is not None:
            result["fixes"] = [_sarif_fix(finding, offer)]
        results.append(result)
    summary = []
    if dropped:
        per_rule = ", ".join(f"{rule} {n:,}" for rule, n in sorted(dropped.items()))
        summary.append(
            f"{sum(dropped.values()):,} results over --sarif-max-results "
            f"{max_results:,} left out ({per_rule})"
        )
    if allowlisted_left_out:
        summary.append(
            f"{allowlisted_left_out:,} allowlisted findings left out "
            "(--sarif-include-allowlisted keeps them)"
        )
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": TOOL_NAME,
                        "version": __version__,
                        "informationUri": DOCS_URI,
                        "rules": [_sarif_rule(rule) for rule in RULES],
                    }
                },
                "originalUriBaseIds": {_SRCROOT: {"uri": _directory_uri(report.root)}},
                "columnKind": "utf16CodeUnits",
                "results": results,
                "properties": {
                    "findings": len(report.findings),
                    "allowlisted": len(report.allowlisted),
                    "resultsLeftOut": dict(sorted(dropped.items())),
                    "allowlistedLeftOut": allowlisted_left_out,
                },
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n", "; ".join(summary)


FORMATS: dict[str, Callable[[Report], str]] = {
    "text": render_text,
    "json": render_json,
    "markdown": render_markdown,
    "sarif": render_sarif,
}


def _inventory_rows(report: Report) -> list[tuple[str, int, Counter[str]]]:
    """(exception, total, by folder), most raised first."""
    rows = [
        (name, sum(by_folder.values()), by_folder)
        for name, by_folder in report.inventory.items()
    ]
    return sorted(rows, key=lambda row: (-row[1], row[0]))


def _columns(folders: list[str], counters: Iterable[Counter[str]]) -> list[str]:
    """The audited folders that have a non-zero count in some row."""
    used = {folder for counter in counters for folder, n in counter.items() if n}
    return [folder for folder in folders if folder in used]


def _folder_heading(folder: str) -> str:
    return "(root)" if folder == "." else f"{folder}/"


def _count(n: int) -> str:
    return f"{n:,}" if n else ""


def _table(header: list[str], rows: list[list[str]], *, numeric_from: int) -> list[str]:
    align = ["---" if i < numeric_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(cells) + " |" for cells in [header, align, *rows]]


def _finding_json(finding: ReportedFinding) -> dict[str, object]:
    return {
        "rule": finding.rule,
        "name": RULES_BY_ID[finding.rule].name,
        "path": finding.path,
        "folder": finding.folder,
        "line": finding.line,
        "column": finding.column,
        "message": finding.message,
        "suggestion": finding.suggestion,
        "scope": finding.scope,
        "fingerprint": finding.fingerprint,
    }


def _sarif_rule(rule: Rule) -> dict[str, object]:
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.description},
        "help": {
            "text": rule.help,
            "markdown": f"{rule.help}\n\nSee [the migration guide]({DOCS_URI}).",
        },
        "helpUri": f"{DOCS_URI}#{rule.id.lower()}-{rule.name}",
        "defaultConfiguration": {"level": rule.level},
        "properties": {"tags": ["error-handling", "vllm-omni"]},
    }


def _directory_uri(root: str) -> str:
    uri = Path(root).as_uri()
    return uri if uri.endswith("/") else uri + "/"


_OFFER_KINDS = {
    "fix": "safe fix (--fix applies it)",
    "unsafe": "unsafe fix, it may change a status (--fix --unsafe-fixes applies it)",
    "suggest": "suggestion",
}


def _sarif_fix(finding: ReportedFinding, offer: Offer) -> dict[str, object]:
    """A rewrite as a SARIF ``fix``: the replacements in the finding's file
    (regions of the file as audited; complete on its own, import included)."""
    kind = _OFFER_KINDS[offer.kind]
    return {
        "description": {"text": f"{offer.description} [{kind}]"},
        "artifactChanges": [
            {
                "artifactLocation": {"uri": finding.uri, "uriBaseId": _SRCROOT},
                "replacements": [
                    {
                        "deletedRegion": {
                            "startLine": r.start_line,
                            "startColumn": r.start_column,
                            "endLine": r.end_line,
                            "endColumn": r.end_column,
                        },
                        "insertedContent": {"text": r.text},
                    }
                    for r in offer.replacements
                ],
            }
        ],
    }


def _sarif_result(finding: ReportedFinding, index: dict[str, int]) -> dict[str, object]:
    # Relative to the project root (%SRCROOT%), the name's bytes as they are.
    location = {"uri": finding.uri, "uriBaseId": _SRCROOT}
    return {
        "ruleId": finding.rule,
        "ruleIndex": index[finding.rule],
        "level": RULES_BY_ID[finding.rule].level,
        "message": {"text": f"{finding.message}. Suggested: {finding.suggestion}."},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": location,
                    "region": {
                        "startLine": finding.line,
                        "startColumn": finding.column,
                    },
                }
            }
        ],
        "partialFingerprints": {"omniSite/v1": finding.fingerprint},
        "properties": {"suggestion": finding.suggestion, "folder": finding.folder},
    }
