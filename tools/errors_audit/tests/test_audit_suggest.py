"""``--suggest``: the rewrites that need a person, as a patch or SARIF fixes.

The patch is applied with ``git apply`` as a contributor would, and the
tree audited again: exactly the suggested sites are gone. Each SARIF fix is
applied on its own from its regions and must do the same for its site.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from textwrap import dedent

import jsonschema
import pytest

from audit_testing import FIXTURES, SARIF_SCHEMA
from vllm_omni_errors_audit import cli

SUGGEST = FIXTURES / "suggest"
PATCH = (SUGGEST / "suggest.patch").read_text()
NOT_SUGGESTED = [
    (
        "app/serving.py:26:13 OMNI001",
        "not at a request boundary: an internal check stays a server error "
        "(RuntimeError), which a person decides",
    ),
    (
        "app/serving.py:32:13 OMNI001",
        "a client error raised in except Exception would make that broad except "
        "an OMNI002 finding",
    ),
    (
        "app/serving.py:37:17 OMNI001",
        "its try's except ValueError catches one of ValueError and "
        "VLLMValidationError, not both",
    ),
    (
        "app/serving.py:44:9 OMNI002",
        "its try body raises nothing itself: what it catches comes from calls, "
        "which a person checks",
    ),
]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(SUGGEST / "app", tmp_path / "app")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main([*args, "--no-cache", "--jobs", "1"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def fingerprints(capsys: pytest.CaptureFixture[str], *paths: str) -> dict[str, str]:
    status, out, _ = run(capsys, *paths, "--format", "json")
    assert status in (0, 1)
    return {f["fingerprint"]: f["message"] for f in json.loads(out)["findings"]}


def git_apply(root: Path, patch: str, *options: str) -> None:
    (root / "audit.patch").write_text(patch)
    subprocess.run(
        ["git", "apply", *options, "audit.patch"],
        cwd=root,
        check=True,
        capture_output=True,
    )


def test_the_patch(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprints(capsys, "app")
    status, patch, err = run(capsys, "app", "--suggest")
    assert status == 1
    assert patch == PATCH
    lines = err.splitlines()
    assert lines[0] == (
        "vllm-omni errors audit: suggested 7 sites in 2 files; 4 left for a person"
    )
    assert [
        tuple(line[len("not suggested: ") :].split(": ", 1)) for line in lines[1:]
    ] == (NOT_SUGGESTED)
    # Nothing was written.
    assert (tree / "app" / "serving.py").read_bytes() == (
        SUGGEST / "app" / "serving.py"
    ).read_bytes()
    git_apply(tree, patch, "--check")
    git_apply(tree, patch)
    after = fingerprints(capsys, "app")
    assert set(after) < set(before)
    assert len(before) - len(after) == 7
    assert not {m for m in after.values() if "top_k" in m or "'speed'" in m}


def test_it_limits_itself_to_the_paths_given(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PR migrates one file: the model's file is read for its fields, and
    left alone."""
    status, patch, _ = run(capsys, "app/serving.py", "--suggest")
    assert status == 1
    assert patch.startswith("--- a/app/serving.py\n")
    assert "speech.py" not in patch
    assert 'parameter="top_k"' in patch
    git_apply(tree, patch, "--check")


def test_nothing_to_suggest_is_an_empty_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clean.py").write_text("def f():\n    raise RuntimeError('x')\n")
    assert run(capsys, "clean.py", "--suggest") == (
        0,
        "",
        "vllm-omni errors audit: suggested 0 sites in 0 files; 0 left for a person\n",
    )


@pytest.mark.parametrize("form", ["json", "markdown"])
def test_suggest_writes_a_patch_or_sarif_only(
    tree: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    status, _, err = run(capsys, "app", "--suggest", "--format", form)
    assert status == 2
    assert "--suggest writes a patch" in err


def _apply_replacements(text: str, replacements: list[dict[str, object]]) -> str:
    """SARIF regions (1-based lines, UTF-16 columns, end exclusive) applied."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(line: int, column: int) -> int:
        row = lines[line - 1] if line <= len(lines) else ""
        units = row.encode("utf-16-le")[: (column - 1) * 2].decode("utf-16-le")
        return starts[line - 1] + len(units)

    edits = []
    for replacement in replacements:
        region = replacement["deletedRegion"]
        assert isinstance(region, dict)
        start = offset(region["startLine"], region["startColumn"])
        end = offset(region["endLine"], region["endColumn"])
        content = replacement["insertedContent"]
        assert isinstance(content, dict)
        edits.append((start, end, content["text"]))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def test_sarif_fixes(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every rewrite (mechanical ones too) as its result's SARIF fix, valid
    against the schema; each applied alone removes its site and no other,
    and the file still compiles."""
    routes = tree / "app" / "routes.py"
    routes.write_text(
        dedent(
            """\
            from fastapi import HTTPException


            def get(job_id: str) -> None:
                raise HTTPException(404, f"job {job_id} not found")
            """
        )
    )
    before = fingerprints(capsys, "app")
    status, out, err = run(capsys, "app", "--suggest", "--format", "sarif")
    assert status == 1
    assert err.startswith("vllm-omni errors audit: offered 8 sites; 6 left")
    log = json.loads(out)
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    fixed = [r for r in log["runs"][0]["results"] if "fixes" in r]
    assert len(fixed) == 8
    kinds = sorted(
        r["fixes"][0]["description"]["text"].rsplit("[", 1)[1] for r in fixed
    )
    assert kinds == ["safe fix (--fix applies it)]"] + ["suggestion]"] * 7
    originals = {p: p.read_text() for p in (tree / "app").rglob("*.py")}
    for result in fixed:
        (change,) = result["fixes"][0]["artifactChanges"]
        path = tree / "app" / change["artifactLocation"]["uri"]
        path.write_text(_apply_replacements(originals[path], change["replacements"]))
        compile(path.read_text(), str(path), "exec")
        after = fingerprints(capsys, "app")
        assert set(before) - set(after) == {
            result["partialFingerprints"]["omniSite/v1"]
        }
        assert set(after) <= set(before)
        path.write_text(originals[path])


def test_raises_outside_any_request_are_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Module level, a plain function, a class that is no request model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tool.py").write_text(
        dedent(
            """\
            if DEBUG:
                raise ValueError("debug needs a log file")


            def load(path: str) -> bytes:
                raise NotImplementedError("remote paths")


            class Loader:
                def load(self, request: dict) -> None:
                    raise TypeError("not a request model")
            """
        )
    )
    status, patch, err = run(capsys, "tool.py", "--suggest")
    assert (status, patch) == (1, "")
    reason = "not at a request boundary"
    assert [line.split(": ", 2)[2].split(":")[0] for line in err.splitlines()[1:]] == [
        reason
    ] * 3


def test_a_sarif_fix_carries_the_clause_it_widens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An HTTPException inside ``except HTTPException: raise`` is offered
    with the clause's widening (the same file); one whose clause is in
    another file is not offered (one file's fix cannot carry it)."""
    monkeypatch.chdir(tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "helpers.py").write_text(
        dedent(
            """\
            from fastapi import HTTPException


            def check(n: int) -> None:
                if n > 4:
                    raise HTTPException(400, "n must be at most 4")
            """
        )
    )
    routes = app / "routes.py"
    routes.write_text(
        dedent(
            """\
            from fastapi import APIRouter, HTTPException

            from app.helpers import check

            router = APIRouter()


            @router.post("/v1/images/generations")
            async def generate(n: int) -> None:
                try:
                    check(n)
                    if n < 1:
                        raise HTTPException(400, "n must be at least 1")
                except HTTPException:
                    raise
                except Exception:
                    raise HTTPException(500, "failed")
            """
        )
    )
    before = fingerprints(capsys, "app")
    status, out, err = run(capsys, "app", "--suggest", "--format", "sarif")
    assert status == 1
    assert err.splitlines()[1:] == [
        "not offered: app/helpers.py:6:15 OMNI005: it needs app/routes.py "
        "(generate: except HTTPException) widened too, which a fix of one file "
        "cannot carry: --fix does both"
    ]
    results = json.loads(out)["runs"][0]["results"]
    offered = {
        r["locations"][0]["physicalLocation"]["region"]["startLine"]: r
        for r in results
        if "fixes" in r
    }
    assert sorted(offered) == [13, 17]
    (change,) = offered[13]["fixes"][0]["artifactChanges"]
    original = routes.read_text()
    fixed = _apply_replacements(original, change["replacements"])
    assert 'raise VLLMValidationError("n must be at least 1")' in fixed
    assert "    except (HTTPException, VLLMError):\n        raise\n" in fixed
    assert "from vllm_omni.errors import VLLMError, VLLMValidationError\n" in fixed
    routes.write_text(fixed)
    compile(fixed, str(routes), "exec")
    after = fingerprints(capsys, "app")
    assert set(before) - set(after) == {
        offered[13]["partialFingerprints"]["omniSite/v1"]
    }


def test_sarif_offers_an_unsafe_fix_only_when_asked_and_labels_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An error model a serving method returns to its caller has no safe
    fix: SARIF offers none, unless ``--unsafe-fixes``, and then labelled as
    the one ``--fix --unsafe-fixes`` applies; applied, it removes the site."""
    monkeypatch.chdir(tmp_path)
    serving = tmp_path / "app" / "serving.py"
    serving.parent.mkdir()
    source = dedent(
        """\
        class Serving:
            def create_speech(self, request):
                if request.input == "":
                    return self.create_error_response("input is empty")
                return self.speak(request)
        """
    )
    serving.write_text(source)
    status, out, _ = run(capsys, "app", "--suggest", "--format", "sarif")
    assert status == 1
    (result,) = json.loads(out)["runs"][0]["results"]
    assert "fixes" not in result
    status, out, err = run(
        capsys, "app", "--suggest", "--format", "sarif", "--unsafe-fixes"
    )
    assert status == 1
    assert err.startswith("vllm-omni errors audit: offered 1 sites; 0 left")
    log = json.loads(out)
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    (result,) = log["runs"][0]["results"]
    (fix,) = result["fixes"]
    assert fix["description"]["text"].endswith(
        "[unsafe fix, it may change a status (--fix --unsafe-fixes applies it)]"
    )
    (change,) = fix["artifactChanges"]
    serving.write_text(_apply_replacements(source, change["replacements"]))
    assert 'raise VLLMValidationError("input is empty")' in serving.read_text()
    assert fingerprints(capsys, "app") == {}
