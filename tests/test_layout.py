"""The tests' own layout (docs/design.md §11): no two test modules share a name.

A name said twice ("test_startup" for the server and for the real engine)
makes a failure line ambiguous and breaks a run of two folders whose modules
are imported by basename (the audit tool's tests are not a package).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_ROOTS = (ROOT / "tests", ROOT / "tools" / "errors_audit" / "tests")


def test_no_two_test_modules_share_a_name() -> None:
    places: defaultdict[str, list[str]] = defaultdict(list)
    for root in TEST_ROOTS:
        for path in root.rglob("test_*.py"):
            if "fixtures" not in path.relative_to(root).parts:
                places[path.name].append(str(path.relative_to(ROOT)))
    assert len(places) > 100
    assert {name: where for name, where in places.items() if len(where) > 1} == {}
