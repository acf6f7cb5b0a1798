"""``--fix`` follows an HTTPException to where it is answered (``flow``).

Each case is a package with one helper that raises ``HTTPException(400)``
and a routes module that calls it in some way; the command runs on the
package, and the helper is either rewritten (its way proven, the clauses
it needs widened) or left with the reason a person reads.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from vllm_omni_errors_audit import cli

HELPER = """\
from fastapi import HTTPException


def check(n: int) -> None:
    if n > 4:
        raise HTTPException(400, "n must be at most 4")
"""
FIXED = """\
from vllm_omni.errors import VLLMValidationError


def check(n: int) -> None:
    if n > 4:
        raise VLLMValidationError("n must be at most 4")
"""
HEAD = """\
import asyncio
from contextlib import suppress

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import StreamingResponse

from svc.api.helpers import check, rows, slow

router = APIRouter()


"""
ROUTE = "routes.py"


def _way(clause: str, what: str) -> str:
    return f"its way meets svc/api/{ROUTE} ({clause}), which {what}"


# name: (the routes module after HEAD, the helper's reason or None when it
# is rewritten, how many clauses are widened)
CASES: dict[str, tuple[str, str | None, int]] = {
    "a catch-all answers both alike": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            try:
                check(n)
            except Exception:
                raise HTTPException(500, "failed")
        """,
        None,
        0,
    ),
    "a clean-up re-raises into a clause that is widened": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            try:
                try:
                    check(n)
                except Exception:
                    print("cleaning up")
                    raise
            except HTTPException:
                raise
            except Exception as exc:
                raise HTTPException(500, f"failed: {exc}") from exc
        """,
        None,
        1,
    ),
    "a handler that hands the exception on": (
        """\
        @router.post("/a")
        async def a(n: int) -> object:
            try:
                check(n)
            except Exception as exc:
                return create_error_response(exc)
        """,
        _way(
            "a: except Exception as exc",
            "hands exc to create_error_response(): what becomes of the exception "
            "there depends on its type",
        ),
        0,
    ),
    "a handler that tells the types apart by isinstance": (
        """\
        @router.post("/a")
        async def a(n: int) -> object:
            try:
                check(n)
            except Exception as exc:
                if isinstance(exc, HTTPException):
                    return {"code": 400}
                return {"code": 500}
        """,
        _way(
            "a: except Exception as exc",
            "hands exc to isinstance(): what becomes of the exception there "
            "depends on its type",
        ),
        0,
    ),
    "a clause to widen that reads what it caught": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            try:
                check(n)
            except HTTPException as exc:
                print(exc.status_code)
                raise
            except Exception:
                raise HTTPException(500, "failed")
        """,
        _way(
            "a: except HTTPException as exc",
            "reads exc.status_code: what becomes of the exception there depends "
            "on its type",
        ),
        0,
    ),
    "a clause that catches the new type and not HTTPException": (
        """\
        from vllm_omni.errors import VLLMClientError


        @router.post("/a")
        async def a(n: int) -> object:
            try:
                check(n)
            except VLLMClientError:
                return {"code": 200}
        """,
        _way(
            "a: except VLLMClientError",
            "catches VLLMValidationError and not HTTPException",
        ),
        0,
    ),
    "a caught type that is a value": (
        """\
        @router.post("/a")
        async def a(n: int, errors: tuple) -> None:
            try:
                check(n)
            except errors:
                raise
        """,
        "its way meets svc/api/routes.py (a: except errors), whose caught type "
        "errors is a value, not a class",
        0,
    ),
    "a module-level tuple of classes": (
        """\
        PASS_THROUGH = (HTTPException, OSError)


        @router.post("/a")
        async def a(n: int) -> None:
            try:
                check(n)
            except PASS_THROUGH:
                raise
            except Exception:
                raise HTTPException(500, "failed")
        """,
        None,
        1,
    ),
    "a callback": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            asyncio.get_running_loop().call_soon(check, n)
        """,
        f"svc/api/{ROUTE}:14 refers to check without calling it (a callback, a "
        "task): where its exception goes from there is not followed",
        0,
    ),
    "a framework dependency": (
        """\
        @router.post("/a")
        async def a(n: int = Depends(check)) -> None:
            return None
        """,
        None,
        0,
    ),
    "a coroutine handed to a task": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            asyncio.create_task(slow(n))
        """,
        "slow",
        0,
    ),
    "a coroutine awaited through wait_for": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            try:
                await asyncio.wait_for(slow(n), timeout=5)
            except HTTPException:
                raise
            except Exception:
                raise HTTPException(500, "failed")
        """,
        None,
        1,
    ),
    "a generator iterated where it is called": (
        """\
        @router.post("/a")
        async def a(n: int) -> list[int]:
            return [row for row in rows(n)]
        """,
        None,
        0,
    ),
    "a generator handed to a streaming response": (
        """\
        @router.post("/a")
        async def a(n: int) -> StreamingResponse:
            return StreamingResponse(rows(n))
        """,
        "rows",
        0,
    ),
    "a suppress that swallows both alike": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            with suppress(Exception):
                check(n)
        """,
        None,
        0,
    ),
    "a suppress that swallows HTTPException only": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            with suppress(HTTPException):
                check(n)
        """,
        "its way meets svc/api/routes.py (a: except HTTPException) (suppress), "
        "which swallows one of HTTPException and VLLMValidationError and not the "
        "other",
        0,
    ),
    "an import under another name": (
        """\
        @router.post("/a")
        async def a(n: int) -> None:
            from svc.api.helpers import check as verify

            verify(n)
        """,
        f"svc/api/{ROUTE}:14 imports check under another name: calls by that "
        "name are not followed",
        0,
    ),
    "a method of the same name elsewhere does not count": (
        """\
        class Other:
            def check(self, n: int) -> None:
                return None

            def run(self) -> None:
                asyncio.get_running_loop().call_soon(self.check, 1)


        @router.post("/a")
        async def a(n: int) -> None:
            check(n)
        """,
        None,
        0,
    ),
}
# The helpers ``slow`` (a coroutine) and ``rows`` (a generator) raise too;
# where a case names one, that helper's site is the one left.
HELPERS = (
    HELPER
    + """

async def slow(n: int) -> None:
    if n > 4:
        raise HTTPException(400, "slow")


def rows(n: int):
    if n > 4:
        raise HTTPException(400, "rows")
    yield n
"""
)
LEFT_FOR = {
    "slow": "svc/api/routes.py:14 calls slow without awaiting it: the coroutine "
    "runs elsewhere",
    "rows": "svc/api/routes.py:14 calls the generator rows without iterating it "
    "there: it raises where it is iterated",
}


def _left(err: str) -> list[str]:
    """The reason of every ``not fixed:`` line of the helpers' file."""
    rows = [
        row
        for row in err.splitlines()
        if row.startswith("not fixed: svc/api/helpers.py:")
    ]
    return [row.split(": ", 2)[2] for row in rows]


@pytest.mark.parametrize("case", list(CASES))
def test_a_helper_s_way(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    routes, reason, widened = CASES[case]
    monkeypatch.chdir(tmp_path)
    api = tmp_path / "svc" / "api"
    api.mkdir(parents=True)
    for folder in (api.parent, api):
        (folder / "__init__.py").write_text("")
    (api / "helpers.py").write_text(HELPERS)
    (api / ROUTE).write_text(HEAD + dedent(routes))
    cli.main(["svc", "--fix", "--no-cache", "--jobs", "1"])
    err = capsys.readouterr().err
    helpers = (api / "helpers.py").read_text()
    if reason is None:
        assert _left(err) == [], err
        assert 'raise VLLMValidationError("n must be at most 4")' in helpers
    elif reason in LEFT_FOR:
        # ``check`` is rewritten; the helper the case names is left.
        assert _left(err) == [LEFT_FOR[reason]]
        assert 'raise VLLMValidationError("n must be at most 4")' in helpers
        assert f'raise HTTPException(400, "{reason}")' in helpers
    else:
        assert _left(err) == [reason]
        assert 'raise HTTPException(400, "n must be at most 4")' in helpers
    assert sum(row.startswith("widened: ") for row in err.splitlines()) == widened
    assert (api / ROUTE).read_text().count("VLLMError)") == widened


def test_the_helper_alone_is_the_fixed_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The case table's first row, whole: the helper's file as --fix
    leaves it."""
    monkeypatch.chdir(tmp_path)
    api = tmp_path / "svc" / "api"
    api.mkdir(parents=True)
    for folder in (api.parent, api):
        (folder / "__init__.py").write_text("")
    (api / "helpers.py").write_text(HELPER)
    (api / ROUTE).write_text(
        HEAD.replace("check, rows, slow", "check")
        + dedent(CASES["a catch-all answers both alike"][0])
    )
    assert cli.main(["svc", "--fix", "--no-cache", "--jobs", "1"]) == 0
    capsys.readouterr()
    assert (api / "helpers.py").read_text() == FIXED
