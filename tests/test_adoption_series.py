"""The patch series for vllm-omni 0.30.0 (``adoption/``), read as files.

That it applies with ``git am`` and what it does to vllm-omni's app is
proven in the adoption environment (``.ci/vllm-omni-030``, tests/adoption);
here, without it: one patch per phase message, in phase order, each a
``git format-patch`` mail whose subject says it is the errors work, every
phase that changes a status carries release notes, and docs/adoption.md
describes every patch.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERIES = ROOT / "adoption"
PHASES = sorted(p.stem for p in (SERIES / "messages").glob("*.txt"))
# The phases that change a status or a body a client sees.
CHANGING = ("2-bridge", "3b-request-boundaries", "4-stage-transports")


def _patches() -> list[Path]:
    return sorted(SERIES.glob("*.patch"))


def test_one_patch_per_phase_in_order() -> None:
    patches = _patches()
    assert len(patches) == len(PHASES) >= 4
    for number, (patch, phase) in enumerate(zip(patches, PHASES, strict=True), 1):
        assert patch.name.startswith(f"{number:04d}-errors-")
        text = patch.read_text()
        assert text.startswith("From 0000000000000000000000000000000000000000 ")
        subject = (SERIES / "messages" / f"{phase}.txt").read_text().splitlines()[0]
        assert subject.startswith("errors: ")
        assert f"[PATCH {number}/{len(PHASES)}] errors: " in text
        assert re.search(r"^diff --git ", text, re.MULTILINE), f"{patch.name} is empty"


def test_every_status_change_has_release_notes() -> None:
    for phase in CHANGING:
        message = (SERIES / "messages" / f"{phase}.txt").read_text()
        assert "Release notes" in message, phase


def test_the_docs_describe_every_patch() -> None:
    docs = (ROOT / "docs" / "adoption.md").read_text()
    for number in range(1, len(_patches()) + 1):
        assert f"| {number:04d} |" in docs, f"docs/adoption.md lacks patch {number:04d}"
