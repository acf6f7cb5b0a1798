"""Measure the sanitizer on the corpus in ``tests/errors/sanitize_corpus.py``.

Rows:

- ``secret recall``: of every secret value in the corpus, the share that is
  gone after sanitizing (goal 100 %; anything less fails the run);
- ``benign byte-identical``: the share of benign messages returned
  unchanged (goal >= 98 %);
- ``cost per message``: microseconds per message over the whole corpus with
  the cache of clean results emptied before each message (every message is
  new to it), against a baseline measured in the same run: the same rule
  table applied as one ``re.sub`` per rule, the obvious implementation the
  single alternation replaces. Best of N interleaved ``timeit`` repeats.

``python benchmarks/bench_sanitize.py`` prints the rows; ``run()`` returns
them for ``python -m benchmarks``.
"""

from __future__ import annotations

import re
import sys
import timeit
from collections.abc import Callable

from tests.errors.sanitize_corpus import BENIGN, SECRET_CASES
from vllm_omni.errors import sanitize

_RECALL_GOAL = 100.0
_BENIGN_GOAL = 98.0


def _per_rule_baseline() -> Callable[[str], str]:
    rules = [(re.compile(pattern), repl) for _, pattern, repl in sanitize._RULES]

    def sanitize_per_rule(text: str) -> str:
        for pattern, repl in rules:
            text = pattern.sub(repl, text)
        return text.strip()[: sanitize.MAX_MESSAGE_CHARS]

    return sanitize_per_rule


def measure() -> dict[str, float]:
    secrets = [(case, value) for case in SECRET_CASES for value in case.remove]
    removed = sum(
        value not in sanitize.sanitize_message(case.text) for case, value in secrets
    )
    identical = sum(sanitize.sanitize_message(text) == text for text in BENIGN)
    texts = list(BENIGN) + [case.text for case in SECRET_CASES]
    baseline = _per_rule_baseline()
    clean = sanitize._CLEAN

    def ours() -> None:
        for text in texts:
            clean.clear()
            sanitize.sanitize_message(text)

    def per_rule() -> None:
        for text in texts:
            baseline(text)

    best = {"ours": float("inf"), "baseline": float("inf")}
    for _ in range(5):
        for name, function in (("ours", ours), ("baseline", per_rule)):
            seconds = timeit.timeit(function, number=3) / 3
            best[name] = min(best[name], seconds * 1e6 / len(texts))
    return {
        "recall": 100.0 * removed / len(secrets),
        "secrets": float(len(secrets)),
        "benign": 100.0 * identical / len(BENIGN),
        "messages": float(len(texts)),
        "us_ours": best["ours"],
        "us_baseline": best["baseline"],
    }


def run() -> list[dict[str, object]]:
    m = measure()
    return [
        {
            "benchmark": f"secret recall ({m['secrets']:.0f} secrets)",
            "ours": m["recall"],
            "baseline": _RECALL_GOAL,
            "ratio": m["recall"] / _RECALL_GOAL,
            "unit": "% removed (goal)",
            "ok": m["recall"] >= _RECALL_GOAL,
        },
        {
            "benchmark": "benign byte-identical",
            "ours": m["benign"],
            "baseline": _BENIGN_GOAL,
            "ratio": m["benign"] / _BENIGN_GOAL,
            "unit": "% unchanged (goal)",
            "ok": m["benign"] >= _BENIGN_GOAL,
        },
        {
            "benchmark": f"sanitize cost ({m['messages']:.0f} messages)",
            "ours": m["us_ours"],
            "baseline": m["us_baseline"],
            "ratio": m["us_ours"] / m["us_baseline"],
            "unit": "us/message (vs one re.sub per rule)",
        },
    ]


def main() -> int:
    rows = run()
    for row in rows:
        print(
            f"{row['benchmark']:<36} {row['ours']:>9.2f} {row['baseline']:>9.2f} "
            f"{row['ratio']:>6.3f}  {row['unit']}"
        )
    return 0 if all(row.get("ok", True) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
