"""Measure the sanitizer: recall, benign text kept, and cost per message.

Three corpora: the curated one in ``tests/errors/sanitize_corpus.py``
(realistic error texts, benign and secret), the one generated from
detect-secrets' rules in ``tests/errors/secret_rules.py``, and the one drawn
from providers' published token formats in ``tests/errors/provider_tokens.py``
(independent of every rule the sanitizer compiles, issue 40). Every row
compares, in the same
run, the sanitizer with the maintained rule set (detect-secrets' plugins and
keyword list, "ours") against our own rules alone (the table before the rule
set was added, "baseline"):

- ``secret recall``: of every secret value in a corpus, the share gone after
  sanitizing (goal 100 % with the rule set; anything less fails the run);
- ``benign byte-identical``: the share of benign messages returned unchanged
  (goal >= 99 %);
- ``sanitize cost`` / ``log redaction cost``: microseconds per message over
  every text of both corpora, with the cache of clean results emptied before
  each message (every message is new to it); best of N interleaved
  ``timeit`` repeats. One more cost row keeps the older baseline: the same
  full table applied as one ``re.sub`` per rule, the obvious implementation
  the single alternation replaces. The benign corpus alone, the common case,
  has a cost row of its own.

``python benchmarks/bench_sanitize.py`` prints the rows; ``run()`` returns
them for ``python -m benchmarks``. ``--against PATH/sanitize.py`` compares
the benign-corpus cost with another tree's sanitizer instead (``against``).
"""

from __future__ import annotations

import importlib.util
import re
import statistics
import sys
import timeit
from collections.abc import Callable, Iterable

from benchmarks.paired import failed
from tests.errors.provider_tokens import provider_corpus
from tests.errors.sanitize_corpus import BENIGN, SECRET_CASES
from tests.errors.secret_rules import rule_corpus
from vllm_omni.errors import sanitize

_RECALL_GOAL = 100.0
_BENIGN_GOAL = 99.0
_REPEATS = 5


def _with(table: object) -> Callable[[str], str]:
    def sanitize_with(text: str) -> str:
        clean = sanitize.make_safe(text[: sanitize._SCAN_LIMIT])
        return sanitize._fixed_point(clean, table=table)  # type: ignore[arg-type]

    return sanitize_with


def _redact_with(table: object) -> Callable[[str], str]:
    def redact_with(text: str) -> str:
        text = sanitize.make_safe(text)
        names = sanitize._active_rules(
            text,
            table.triggered_credentials,  # type: ignore[attr-defined]
            table.credentials,  # type: ignore[attr-defined]
        )
        return sanitize._substitute(table, names, text) if names else text  # type: ignore[arg-type]

    return redact_with


def _per_rule_baseline() -> Callable[[str], str]:
    table = sanitize._table()
    rules = [
        (re.compile(f"(?P<{name}>{pattern})"), repl)
        for name, pattern, repl in table.rules
    ]

    def sanitize_per_rule(text: str) -> str:
        for pattern, repl in rules:
            text = pattern.sub(repl, text)
        return text.strip()[: sanitize.MAX_MESSAGE_CHARS]

    return sanitize_per_rule


def _values(case: object) -> tuple[str, ...]:
    """What must be gone from a case of any of the three corpora."""
    for field in ("remove", "secrets"):
        if hasattr(case, field):
            return tuple(getattr(case, field))
    return (case.token,)  # type: ignore[attr-defined]


def _recall(function: Callable[[str], str], cases: Iterable[object]) -> float:
    pairs = [
        (case.text, value)  # type: ignore[attr-defined]
        for case in cases
        for value in _values(case)
    ]
    removed = sum(value not in function(text) for text, value in pairs)
    return 100.0 * removed / len(pairs)


def _us_per_message(
    functions: dict[str, Callable[[str], str]], texts: list[str], repeats: int
) -> dict[str, float]:
    clean = sanitize._CLEAN

    def timed(function: Callable[[str], str]) -> Callable[[], None]:
        def each() -> None:
            for text in texts:
                clean.clear()
                function(text)

        return each

    best = dict.fromkeys(functions, float("inf"))
    for _ in range(repeats):
        for name, function in functions.items():
            seconds = timeit.timeit(timed(function), number=3) / 3
            best[name] = min(best[name], seconds * 1e6 / len(texts))
    return best


def measure(repeats: int = _REPEATS) -> dict[str, float]:
    after, before = sanitize._table(), sanitize._table(rule_set=False)
    ours, theirs = _with(after), _with(before)
    rules = rule_corpus()
    texts = list(BENIGN) + [c.text for c in SECRET_CASES] + [c.text for c in rules]
    cost = _us_per_message(
        {
            "ours": ours,
            "before": theirs,
            "per_rule": _per_rule_baseline(),
            "redact": _redact_with(after),
            "redact_before": _redact_with(before),
        },
        texts,
        repeats,
    )
    benign_cost = _us_per_message(
        {"ours": ours, "before": theirs}, list(BENIGN), repeats
    )
    providers = provider_corpus()
    return {
        "curated_secrets": float(sum(len(c.remove) for c in SECRET_CASES)),
        "curated_recall": _recall(ours, SECRET_CASES),
        "curated_recall_before": _recall(theirs, SECRET_CASES),
        "rule_secrets": float(sum(len(c.secrets) for c in rules)),
        "rule_recall": _recall(ours, rules),
        "rule_recall_before": _recall(theirs, rules),
        "log_rule_recall": _recall(_redact_with(after), rules),
        "provider_tokens": float(len(providers)),
        "provider_recall": _recall(ours, providers),
        "provider_recall_before": _recall(theirs, providers),
        "log_provider_recall": _recall(_redact_with(after), providers),
        "us_benign": benign_cost["ours"],
        "us_benign_before": benign_cost["before"],
        "benign": 100.0 * sum(ours(t) == t for t in BENIGN) / len(BENIGN),
        "benign_before": 100.0 * sum(theirs(t) == t for t in BENIGN) / len(BENIGN),
        "messages": float(len(texts)),
        **{f"us_{name}": value for name, value in cost.items()},
    }


def run(quick: bool = False) -> list[dict[str, object]]:
    m = measure(1 if quick else _REPEATS)
    messages = f"{m['messages']:.0f} messages"
    return [
        {
            "benchmark": f"secret recall, curated ({m['curated_secrets']:.0f} secrets)",
            "ours": m["curated_recall"],
            "baseline": m["curated_recall_before"],
            "ratio": m["curated_recall"] / m["curated_recall_before"],
            "unit": "% removed (vs our rules alone)",
            "ok": m["curated_recall"] >= _RECALL_GOAL,
        },
        {
            "benchmark": "secret recall, detect-secrets rules "
            f"({m['rule_secrets']:.0f} secrets)",
            "ours": m["rule_recall"],
            "baseline": m["rule_recall_before"],
            "ratio": m["rule_recall"] / m["rule_recall_before"],
            "unit": "% removed (vs our rules alone)",
            "ok": m["rule_recall"] >= _RECALL_GOAL
            and m["log_rule_recall"] >= _RECALL_GOAL,
        },
        {
            "benchmark": "secret recall, provider formats "
            f"({m['provider_tokens']:.0f} tokens)",
            "ours": m["provider_recall"],
            "baseline": m["provider_recall_before"],
            "ratio": m["provider_recall"] / m["provider_recall_before"],
            "unit": "% removed (vs our rules alone)",
            "ok": m["provider_recall"] >= _RECALL_GOAL
            and m["log_provider_recall"] >= _RECALL_GOAL,
        },
        {
            "benchmark": f"benign byte-identical ({len(BENIGN)} messages)",
            "ours": m["benign"],
            "baseline": m["benign_before"],
            "ratio": m["benign"] / m["benign_before"],
            "unit": "% unchanged (vs our rules alone)",
            "ok": m["benign"] >= _BENIGN_GOAL,
        },
        {
            "benchmark": f"sanitize cost ({messages})",
            "ours": m["us_ours"],
            "baseline": m["us_before"],
            "ratio": m["us_ours"] / m["us_before"],
            "unit": "us/message (vs our rules alone)",
        },
        {
            "benchmark": f"sanitize cost, benign only ({len(BENIGN)} messages)",
            "ours": m["us_benign"],
            "baseline": m["us_benign_before"],
            "ratio": m["us_benign"] / m["us_benign_before"],
            "unit": "us/message (vs our rules alone)",
        },
        {
            "benchmark": f"sanitize cost ({messages}), one pass",
            "ours": m["us_ours"],
            "baseline": m["us_per_rule"],
            "ratio": m["us_ours"] / m["us_per_rule"],
            "unit": "us/message (vs one re.sub per rule)",
        },
        {
            "benchmark": f"log redaction cost ({messages})",
            "ours": m["us_redact"],
            "baseline": m["us_redact_before"],
            "ratio": m["us_redact"] / m["us_redact_before"],
            "unit": "us/line (vs our rules alone)",
        },
    ]


def against(path: str, rounds: int = 300) -> list[dict[str, object]]:
    """This tree's sanitizer against another tree's ``sanitize.py`` (say,
    main's before a change) on the benign corpus, in this process: each
    round times both back to back, in alternating order, and the row is the
    median of the rounds' ratios, which a loaded machine moves far less than
    a best-of-N figure."""
    spec = importlib.util.spec_from_file_location("baseline_sanitize", path)
    assert spec is not None and spec.loader is not None, path
    baseline = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = baseline
    spec.loader.exec_module(baseline)
    rows: list[dict[str, object]] = []
    for name, unit in (("sanitize_message", "message"), ("redact_credentials", "line")):
        pair = []
        for module in (sanitize, baseline):
            module._table()
            function, clean = getattr(module, name), module._CLEAN

            def each(
                function: Callable[[str], str] = function, clean: dict = clean
            ) -> None:
                for text in BENIGN:
                    clean.clear()
                    function(text)

            pair.append(each)
        times: tuple[list[float], list[float]] = ([], [])
        for index in range(rounds):
            for side in (0, 1) if index % 2 else (1, 0):
                times[side].append(timeit.timeit(pair[side], number=1))
        ratios = [ours / theirs for ours, theirs in zip(*times, strict=True)]
        rows.append(
            {
                "benchmark": f"{name}, benign only ({len(BENIGN)} messages)",
                "ours": statistics.median(times[0]) * 1e6 / len(BENIGN),
                "baseline": statistics.median(times[1]) * 1e6 / len(BENIGN),
                "ratio": statistics.median(ratios),
                "unit": f"us/{unit} (vs {path}, median of {rounds} paired rounds)",
            }
        )
    return rows


def main() -> int:
    # ``--against PATH``: compare with another tree's sanitize.py instead.
    if len(sys.argv) == 3 and sys.argv[1] == "--against":
        rows = against(sys.argv[2])
    else:
        rows = run()
    for row in rows:
        print(
            f"{row['benchmark']:<52} {row['ours']:>9.2f} {row['baseline']:>9.2f} "
            f"{row['ratio']:>6.3f}  {row['unit']}"
        )
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
