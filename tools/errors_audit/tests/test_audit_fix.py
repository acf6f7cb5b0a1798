"""``--fix``: the rewrites that need no judgement, applied in place.

Each case is a file before and after, through the command as users run it;
what is left is listed on stderr with its reason, and a second run changes
nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import pytest

import vllm_omni.errors
from audit_testing import REPO
from vllm_omni_errors_audit import cli, flow, rules

Case = tuple[str, str, str | None, list[tuple[str, str]]]
TO_CALLER = (
    "the error model goes to a caller that sets the status from it; "
    "raising instead changes what that caller catches"
)

KEYWORD_FORM: Case = (
    "api/jobs.py",
    '''\
    """Jobs."""

    from http import HTTPStatus

    from fastapi import APIRouter, HTTPException

    from vllm_omni.errors import OmniClientError

    router = APIRouter()


    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> dict:
        if job_id not in JOBS:
            raise HTTPException(
                status_code=HTTPStatus.NOT_FOUND.value,  # jobs expire after a day
                detail=f"job {job_id} not found",
            )
        if JOBS[job_id].running:
            raise HTTPException(409, "job is running") from None
        return JOBS[job_id]


    def check(job: dict) -> None:
        if not job:
            raise OmniClientError("empty job", status_code=400)
    ''',
    '''\
    """Jobs."""

    from fastapi import APIRouter

    from vllm_omni.errors import OmniClientError, OmniConflictError, VLLMNotFoundError

    router = APIRouter()


    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> dict:
        if job_id not in JOBS:
            raise VLLMNotFoundError(  # jobs expire after a day
                f"job {job_id} not found",
            )
        if JOBS[job_id].running:
            raise OmniConflictError("job is running") from None
        return JOBS[job_id]


    def check(job: dict) -> None:
        if not job:
            raise OmniClientError("empty job", status_code=400)
    ''',
    [],
)

STATUS_NAMES: Case = (
    "api/lookup.py",
    """\
    from fastapi import HTTPException, status


    def find(name: str) -> None:
        if name == "old":
            raise HTTPException(status.HTTP_404_NOT_FOUND)
        raise HTTPException(status_code=502, detail="upstream failed")
    """,
    """\
    from vllm_omni.errors import OmniServerError, VLLMNotFoundError


    def find(name: str) -> None:
        if name == "old":
            raise VLLMNotFoundError("Not Found")
        raise OmniServerError("upstream failed", status_code=502)
    """,
    [],
)

LEFT: Case = (
    "api/guard.py",
    """\
    from fastapi import HTTPException


    def guard(size: int, code: int) -> None:
        if size > 4096:
            raise HTTPException(status_code=413, detail="too large")
        if size > 2048:
            raise HTTPException(status_code=302, detail="elsewhere")
        if code:
            raise HTTPException(status_code=code, detail="upstream")
        if size < 0:
            raise HTTPException(400, "negative", headers={"X-Reason": "size"})
        if size == 1:
            raise HTTPException(422, detail={"field": "size"})
        error = HTTPException(400, "kept for later")
        raise error
    """,
    """\
    from fastapi import HTTPException
    from vllm_omni.errors import OmniClientError


    def guard(size: int, code: int) -> None:
        if size > 4096:
            raise OmniClientError("too large", status_code=413)
        if size > 2048:
            raise HTTPException(status_code=302, detail="elsewhere")
        if code:
            raise HTTPException(status_code=code, detail="upstream")
        if size < 0:
            raise HTTPException(400, "negative", headers={"X-Reason": "size"})
        if size == 1:
            raise HTTPException(422, detail={"field": "size"})
        error = HTTPException(400, "kept for later")
        raise error
    """,
    [
        ("OMNI005", "302 is not an error status"),
        ("OMNI005", "its status is not a literal"),
        ("OMNI005", "headers= has no equivalent on a semantic exception"),
        ("OMNI005", "its detail is structured data, not a message"),
        ("OMNI005", "HTTPException(...) is built, not raised, here"),
    ],
)

CAUGHT: Case = (
    "web/images.py",
    """\
    from fastapi import APIRouter, HTTPException

    router = APIRouter()


    @router.post("/v1/images/generations")
    async def generate(request: ImageRequest) -> bytes:
        try:
            if request.n > 4:
                raise HTTPException(400, "n must be at most 4")
            return await engine.generate(request)
        except HTTPException:
            raise
        except Exception as exc:
            raise HTTPException(status_code=500, detail=str(exc)) from exc
    """,
    """\
    from fastapi import APIRouter, HTTPException
    from vllm_omni.errors import VLLMError, VLLMServerError, VLLMValidationError

    router = APIRouter()


    @router.post("/v1/images/generations")
    async def generate(request: ImageRequest) -> bytes:
        try:
            if request.n > 4:
                raise VLLMValidationError("n must be at most 4")
            return await engine.generate(request)
        except (HTTPException, VLLMError):
            raise
        except Exception as exc:
            raise VLLMServerError(str(exc)) from exc
    """,
    [],
)

RESPONSES: Case = (
    "api/speech.py",
    """\
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse

    router = APIRouter()


    @router.post("/v1/speech")
    async def speech(request: SpeechRequest):
        if request.voice is None:
            return JSONResponse({"error": "no voice", "code": 400})
        if request.speed > 4:
            return JSONResponse(
                content={"error": {"message": "too fast", "code": 422}},
            )
        return await svc.create_speech(request)


    @router.get("/v1/voices/{name}")
    async def voice(name: str):
        return create_error_response("gone", status_code=404)


    class Serving:
        def create_speech(self, request):
            if request.input == "":
                return self.create_error_response("input is empty")
            return ErrorResponse(error=ErrorInfo(message="no", code=self.code))
    """,
    """\
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse
    from fastapi.encoders import jsonable_encoder

    router = APIRouter()


    @router.post("/v1/speech")
    async def speech(request: SpeechRequest):
        if request.voice is None:
            return JSONResponse({"error": "no voice", "code": 400}, status_code=400)
        if request.speed > 4:
            return JSONResponse(
                content={"error": {"message": "too fast", "code": 422}},
                status_code=422,
            )
        return await svc.create_speech(request)


    @router.get("/v1/voices/{name}")
    async def voice(name: str):
        return JSONResponse(
            content=jsonable_encoder(create_error_response("gone", status_code=404)),
            status_code=404,
        )


    class Serving:
        def create_speech(self, request):
            if request.input == "":
                return self.create_error_response("input is empty")
            return ErrorResponse(error=ErrorInfo(message="no", code=self.code))
    """,
    [
        ("OMNI003", TO_CALLER),
        ("OMNI003", "its error's code is not a literal status"),
    ],
)

RANGES: Case = (
    "engine/owner.py",
    """\
    from vllm_omni.errors import OmniErrorDetails, is_client_error_status, normalize


    def owner(details: OmniErrorDetails) -> str:
        if 400 <= details.status_code < 500:
            return "client"
        return "server"


    def retry(exc: Exception) -> bool:
        record = normalize(exc)
        return record.status_code >= 500


    def legacy(details: OmniErrorDetails) -> bool:
        return not is_client_error_status(details.status_code)


    def guess(status_code: int) -> bool:
        return 400 <= status_code < 500


    def error(details: OmniErrorDetails) -> bool:
        return 400 <= details.status_code < 600
    """,
    """\
    from vllm_omni.errors import OmniErrorDetails, normalize


    def owner(details: OmniErrorDetails) -> str:
        if details.category == "client":
            return "client"
        return "server"


    def retry(exc: Exception) -> bool:
        record = normalize(exc)
        return record.category == "server"


    def legacy(details: OmniErrorDetails) -> bool:
        return not details.category == "client"


    def guess(status_code: int) -> bool:
        return 400 <= status_code < 500


    def error(details: OmniErrorDetails) -> bool:
        return 400 <= details.status_code < 600
    """,
    [
        ("OMNI004", "the status does not come from an OmniErrorDetails record"),
        ("OMNI004", "the guess does not split client from server"),
    ],
)

CASES = [KEYWORD_FORM, STATUS_NAMES, LEFT, CAUGHT, RESPONSES, RANGES]


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main([*args, "--no-cache"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def write(root: Path, case: Case) -> Path:
    path = root / case[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dedent(case[1]))
    return path


def left(err: str) -> list[tuple[str, str]]:
    """(rule, reason) of every ``not fixed:`` line."""
    rows = [line for line in err.splitlines() if line.startswith("not fixed: ")]
    return [(row.split(" ")[3].rstrip(":"), row.split(": ", 2)[2]) for row in rows]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_fix(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, case)
    before = path.read_bytes()
    folder = case[0].split("/")[0]
    status, _, err = run(folder, "--fix", "--jobs", "1", capsys=capsys)
    expected = before.decode() if case[2] is None else dedent(case[2])
    assert path.read_text() == expected
    assert status == (1 if case[3] else 0), err
    assert left(err) == case[3]
    # A second run changes nothing.
    rerun, _, again = run(folder, "--fix", capsys=capsys)
    assert path.read_text() == expected
    assert "fixed 0 sites in 0 files" in again
    assert rerun == status


def test_the_whole_set_at_once_with_two_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The process pool (several files) gives the files of the one-by-one
    runs, and one summary."""
    monkeypatch.chdir(tmp_path)
    for case in CASES:
        write(tmp_path, case)
    status, out, err = run(
        "api",
        "engine",
        "web",
        "--fix",
        "--jobs",
        "2",
        "--format",
        "json",
        capsys=capsys,
    )
    for name, before, after, _ in CASES:
        expected = dedent(before if after is None else after)
        assert (tmp_path / name).read_text() == expected
    assert status == 1
    assert err.splitlines()[0] == (
        "vllm-omni errors audit: fixed 13 sites in 6 files; "
        f"{len(json.loads(out)['findings'])} findings remain; 9 left for a person"
    )
    assert sorted(left(err)) == sorted(row for case in CASES for row in case[3])


HELPER = """\
from fastapi import HTTPException


def parse_lora(lora: dict | None) -> dict:
    if lora is None:
        raise HTTPException(400, "lora is required")
    return lora
"""
ROUTES = """\
from fastapi import APIRouter, HTTPException

from svc.api.helpers import parse_lora

router = APIRouter()


@router.post("/v1/images/generations")
async def images(request: ImageRequest) -> dict:
    try:
        return await generate(parse_lora(request.lora))
    except HTTPException:
        raise
    except Exception as exc:
        raise HTTPException(500, str(exc)) from exc
"""
FIXED_HELPER = """\
from vllm_omni.errors import VLLMValidationError


def parse_lora(lora: dict | None) -> dict:
    if lora is None:
        raise VLLMValidationError("lora is required")
    return lora
"""


# The route's except clause written otherwise: across lines, under an
# imported alias; and what --fix makes of each.
ROUTE_FORMS = {
    "one line": (
        "    except HTTPException:\n",
        "    except (HTTPException, VLLMError):\n",
        "except HTTPException",
    ),
    "across lines": (
        "    except (\n        OSError,\n        HTTPException,\n    ):\n",
        "    except (\n        OSError,\n        HTTPException,\n        VLLMError,\n"
        "    ):\n",
        "except HTTPException, OSError",
    ),
    "aliased": (
        "    except StarletteError:\n",
        "    except (StarletteError, VLLMError):\n",
        "except HTTPException",
    ),
}


def _package(root: Path) -> Path:
    api = root / "svc" / "api"
    api.mkdir(parents=True)
    for folder in (api.parent, api):
        (folder / "__init__.py").write_text("")
    (api / "helpers.py").write_text(HELPER)
    return api


@pytest.mark.parametrize("form", list(ROUTE_FORMS))
@pytest.mark.parametrize("lexer", ["C lexer", "pure Python"])
def test_the_route_s_clause_is_widened_however_written(
    form: str,
    lexer: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A helper's HTTPException(400) is raised inside the route's ``except
    HTTPException: raise`` / ``except Exception`` (a 500). --fix follows it
    there (the helper's callers are found in the whole package, with the
    C lexer's needle pass or without it) and widens the clause, so the
    helper's VLLMValidationError passes it as the HTTPException did."""
    if lexer == "pure Python":
        monkeypatch.setattr(flow, "_lexer", None)
    monkeypatch.chdir(tmp_path)
    api = _package(tmp_path)
    old, new, clause = ROUTE_FORMS[form]
    routes = ROUTES.replace("    except HTTPException:\n", old)
    if form == "aliased":
        routes = routes.replace(
            "from fastapi import APIRouter, HTTPException\n",
            "from fastapi import APIRouter, HTTPException\n"
            "from starlette.exceptions import HTTPException as StarletteError\n",
        )
    (api / "routes.py").write_text(routes)
    status, _, err = run("svc", "--fix", capsys=capsys)
    assert status == 0, err
    assert (api / "helpers.py").read_text() == FIXED_HELPER
    fixed = (api / "routes.py").read_text()
    assert fixed.count(new) == 1
    assert "from vllm_omni.errors import VLLMError, VLLMServerError\n" in fixed
    assert "raise VLLMServerError(str(exc)) from exc" in fixed
    line = fixed.splitlines().index(new.splitlines()[0]) + 1
    assert [row for row in err.splitlines() if row.startswith("widened: ")] == [
        f"widened: svc/api/routes.py:{line}:5 {clause}: VLLMError joins it, so "
        "the rewritten raises take it as HTTPException did"
    ]
    # A second run changes nothing.
    status, _, again = run("svc", "--fix", capsys=capsys)
    assert "fixed 0 sites in 0 files" in again
    assert (api / "routes.py").read_text() == fixed


def test_a_helper_is_left_while_the_clause_it_needs_is_not_among_the_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given only the helper, --fix may not widen the route's clause (it
    writes below the paths given only): the helper is left, naming the
    clause. Given both, both are fixed."""
    monkeypatch.chdir(tmp_path)
    api = _package(tmp_path)
    (api / "routes.py").write_text(ROUTES)
    status, _, err = run("svc/api/helpers.py", "--fix", capsys=capsys)
    assert status == 1
    assert (api / "helpers.py").read_text() == HELPER
    assert left(err) == [
        (
            "OMNI005",
            "its way meets svc/api/routes.py (images: except HTTPException), which "
            "lets HTTPException through and not VLLMValidationError; --fix would "
            "widen it, but its file is not among the paths given",
        )
    ]
    status, _, err = run(
        "svc/api/helpers.py", "svc/api/routes.py", "--fix", capsys=capsys
    )
    assert status == 0, err
    assert (api / "helpers.py").read_text() == FIXED_HELPER


def test_an_allowlisted_site_and_the_errors_package_are_never_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    source = "from fastapi import HTTPException\n\nraise HTTPException(404, 'x')\n"
    for name in ("api/routes.py", "vllm_omni/errors/render.py"):
        (tmp_path / name).parent.mkdir(parents=True)
        (tmp_path / name).write_text(source)
    allow = tmp_path / "allow.toml"
    allow.write_text(
        '[[allow]]\nrule = "OMNI005"\npath = "api/*"\nreason = "vendored"\n'
    )
    status, _, err = run(
        "api", "vllm_omni", "--fix", "--allowlist", str(allow), capsys=capsys
    )
    assert status == 0
    assert "fixed 0 sites in 0 files; 0 findings remain" in err
    for name in ("api/routes.py", "vllm_omni/errors/render.py"):
        assert (tmp_path / name).read_text() == source


def test_a_file_that_does_not_parse_is_never_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The skeleton audits a file with a syntax error in a statement no rule
    needs (docs/design.md §8's documented trade); --fix parses the whole file and
    leaves it, byte for byte."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "api").mkdir()
    path = tmp_path / "api" / "broken.py"
    path.write_text(
        "from fastapi import HTTPException\n\n\ndef cold():\n    x = = 1\n\n\n"
        "def hot():\n    raise HTTPException(404, 'x')\n"
    )
    before = path.read_bytes()
    status, _, err = run("api", "--fix", capsys=capsys)
    assert path.read_bytes() == before
    assert status == 1
    assert left(err) == [
        ("OMNI005", "the file does not parse as a whole, so it is never rewritten")
    ]


def test_encoding_line_breaks_and_other_bytes_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "api").mkdir()
    path = tmp_path / "api" / "latin.py"
    path.write_bytes(
        b"# -*- coding: latin-1 -*-\r\n"
        b"from fastapi import HTTPException\r\n"
        b"\r\n"
        b"# caf\xe9\r\n"
        b"def f():\r\n"
        b'    raise HTTPException(status_code=404, detail="caf\xe9")  # \xe9\r\n'
    )
    path.chmod(0o640)
    status, _, _ = run("api", "--fix", capsys=capsys)
    assert status == 0
    assert path.read_bytes() == (
        b"# -*- coding: latin-1 -*-\r\n"
        b"from vllm_omni.errors import VLLMNotFoundError\r\n"
        b"\r\n"
        b"# caf\xe9\r\n"
        b"def f():\r\n"
        b'    raise VLLMNotFoundError("caf\xe9")  # \xe9\r\n'
    )
    assert path.stat().st_mode & 0o777 == 0o640


def test_the_baseline_tightens_after_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, KEYWORD_FORM)
    write(tmp_path, LEFT)
    baseline = tmp_path / "baseline.json"
    assert (
        run("api", "--baseline", str(baseline), "--update-baseline", capsys=capsys)[0]
        == 0
    )
    sites = json.loads(baseline.read_text())["sites"]
    assert len(sites) == 2 + 6
    status, _, err = run("api", "--fix", "--baseline", str(baseline), capsys=capsys)
    assert status == 0
    assert err.count("tightenable: jobs.py") == 2
    assert err.count("tightenable: guard.py") == 1
    assert "run with --update-baseline" in err
    status, _, err = run(
        "api", "--baseline", str(baseline), "--update-baseline", capsys=capsys
    )
    assert status == 0
    after = json.loads(baseline.read_text())["sites"]
    assert {s["path"] for s in after} == {"guard.py"}
    assert len(after) == 5


def test_fix_and_update_baseline_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, STATUS_NAMES)
    write(tmp_path, LEFT)
    baseline = tmp_path / "baseline.json"
    run("api", "--baseline", str(baseline), "--update-baseline", capsys=capsys)
    status, _, err = run(
        "api", "--fix", "--baseline", str(baseline), "--update-baseline", capsys=capsys
    )
    assert status == 0
    assert f"baseline {baseline} updated" in err
    assert len(json.loads(baseline.read_text())["sites"]) == 5


def test_a_plain_audit_does_not_load_the_rewriter(tmp_path: Path) -> None:
    """LibCST and the rewrite modules load for --fix/--suggest only, so the
    audit's start-up stays what it was."""
    (tmp_path / "mod.py").write_text("raise ValueError('x')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "vllm_omni_errors_audit",
            str(tmp_path),
            "--no-cache",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert done.returncode == 1
    assert "vllm_omni_errors_audit.scanner" in imported
    assert not {m for m in imported if m.split(".")[0] == "libcst"}
    assert imported.isdisjoint(
        {
            "vllm_omni_errors_audit.rewrite",
            "vllm_omni_errors_audit.codemod",
            "vllm_omni_errors_audit.flow",
            "vllm_omni_errors_audit.migrate",
        }
    )


def test_fix_and_suggest_import_no_vllm_torch_or_fastapi(tmp_path: Path) -> None:
    """docs/design.md §8 holds for the rewrites too: LibCST, never the audited
    tree's frameworks."""
    write(tmp_path, KEYWORD_FORM)
    probe = (
        "import sys\n"
        "from vllm_omni_errors_audit import cli\n"
        "fixed = cli.main(['api', '--fix', '--no-cache', '--jobs', '1'])\n"
        "suggested = cli.main(['api', '--suggest', '--no-cache', '--jobs', '1'])\n"
        "heavy = {m.split('.')[0] for m in sys.modules}\n"
        "heavy &= {'vllm', 'torch', 'fastapi', 'starlette', 'pydantic', 'numpy'}\n"
        "print(fixed, suggested, 'libcst' in sys.modules, sorted(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines()[-1] == "0 0 True []", done.stderr


def test_every_type_fix_raises_shares_the_base_a_widened_clause_names() -> None:
    """What ``except (HTTPException, VLLMError)`` lets through covers every
    type --fix raises, in the audit's table and in the classes themselves,
    and each keeps the status the HTTPException had."""
    base = getattr(vllm_omni.errors, rules.FIX_BASE)
    for status in range(400, 600):
        chosen = rules.semantic_type_for_status(status)
        assert chosen is not None, status
        name, explicit = chosen
        assert rules.FIX_BASE in rules.ancestors(name), name
        cls = getattr(vllm_omni.errors, name)
        assert issubclass(cls, base), name
        made = cls("x", status_code=status) if explicit else cls("x")
        assert vllm_omni.errors.normalize(made).status_code == status
    assert rules.semantic_type_for_status(302) is None


UNSAFE_BEFORE = """\
from fastapi import HTTPException


class Serving:
    def create_speech(self, request):
        if request.input == "":
            return self.create_error_response("input is empty")
        if request.voice not in VOICES:
            return self.create_error_response(
                err_type="NotFoundError",
                message=f"voice {request.voice!r} not found",
                status_code=404,
            )
        if self.busy:
            return self.create_error_response(
                "try again later",  # a queue of one
                "RateLimitError",
                429,
            )
        if request.speed > 4:
            return self.create_error_response(
                "too fast",
                status_code=422,  # the schema's bound
            )
        return self.speak(request)


def job(request) -> dict:
    try:
        if request.n > 4:
            raise HTTPException(400, "n must be at most 4")
        return run(request)
    except Exception as exc:
        return {"error": describe(exc)}
"""

UNSAFE_AFTER = """\
from vllm_omni.errors import (
    OmniClientError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)


class Serving:
    def create_speech(self, request):
        if request.input == "":
            raise VLLMValidationError("input is empty")
        if request.voice not in VOICES:
            raise VLLMNotFoundError(
                f"voice {request.voice!r} not found",
            )
        if self.busy:
            raise OmniClientError(
                "try again later",  # a queue of one
                status_code=429,
            )
        if request.speed > 4:
            raise VLLMUnprocessableEntityError(
                "too fast",  # the schema's bound
            )
        return self.speak(request)


def job(request) -> dict:
    try:
        if request.n > 4:
            raise VLLMValidationError("n must be at most 4")
        return run(request)
    except Exception as exc:
        return {"error": describe(exc)}
"""


def unsafe_rows(err: str) -> list[tuple[str, str, str]]:
    """(line, rule, why) of every ``unsafe:`` line."""
    rows = [line for line in err.splitlines() if line.startswith("unsafe: ")]
    return [
        (
            row.split(" ")[1].split(":")[1],
            row.split(" ")[2].rstrip(":"),
            row.partition("; unsafe: ")[2],
        )
        for row in rows
    ]


def test_unsafe_fixes_rewrite_what_may_change_a_status_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain --fix leaves the error models a caller converts and the raise
    whose way meets a clause that looks at the exception; --unsafe-fixes
    rewrites them (the message kept, the status as the type or as
    ``status_code=``, a comment on a dropped argument moved to the line
    before) and lists each as ``unsafe:`` with why."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "app" / "speech.py"
    path.parent.mkdir()
    path.write_text(UNSAFE_BEFORE)
    handed = (
        "its way meets app/speech.py (job: except Exception as exc), which hands "
        "exc to describe(): what becomes of the exception there depends on its type"
    )
    status, _, err = run("app", "--fix", capsys=capsys)
    assert path.read_text() == UNSAFE_BEFORE
    assert sorted(left(err)) == [("OMNI003", TO_CALLER)] * 4 + [("OMNI005", handed)]
    assert unsafe_rows(err) == []

    status, _, err = run("app", "--fix", "--unsafe-fixes", capsys=capsys)
    assert status == 0, err
    assert path.read_text() == UNSAFE_AFTER
    assert err.splitlines()[0] == (
        "vllm-omni errors audit: fixed 5 sites in 1 files; 0 findings remain; "
        "0 left for a person"
    )
    assert unsafe_rows(err) == [
        ("7", "OMNI003", TO_CALLER),
        ("9", "OMNI003", TO_CALLER),
        ("15", "OMNI003", TO_CALLER),
        ("21", "OMNI003", TO_CALLER),
        ("31", "OMNI005", handed),
    ]
    assert left(err) == []
    compile(path.read_text(), str(path), "exec")
    # A second run changes nothing.
    again, _, err = run("app", "--fix", "--unsafe-fixes", capsys=capsys)
    assert path.read_text() == UNSAFE_AFTER
    assert "fixed 0 sites in 0 files" in err
    assert again == 0


@pytest.mark.parametrize(
    "options",
    [["--unsafe-fixes"], ["--unsafe-fixes", "--suggest"]],
    ids=["alone", "with a patch"],
)
def test_unsafe_fixes_needs_fix_or_sarif_offers(
    options: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "speech.py").write_text(UNSAFE_BEFORE)
    status, out, err = run("app", *options, capsys=capsys)
    assert status == 2
    assert out == ""
    assert err == (
        "vllm-omni errors audit: error: --unsafe-fixes needs --fix "
        "(or --suggest --format sarif)\n"
    )
    assert (tmp_path / "app" / "speech.py").read_text() == UNSAFE_BEFORE


def test_unsafe_fixes_leave_what_they_cannot_raise_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An awaited model, unpacked arguments and a parenthesized return are
    left, with the reason, and the file is not touched."""
    monkeypatch.chdir(tmp_path)
    source = dedent(
        """\
        class Serving:
            async def create(self, request):
                if request.x:
                    return await self.create_error_response("awaited")
                if request.y:
                    return self.create_error_response(*request.args)
                if request.z:
                    return self.create_error_response("m", *request.rest)
                return (
                    self.create_error_response("parenthesized")
                )
        """
    )
    path = tmp_path / "app" / "serving.py"
    path.parent.mkdir()
    path.write_text(source)
    status, _, err = run("app", "--fix", "--unsafe-fixes", capsys=capsys)
    assert status == 1
    assert path.read_text() == source
    assert unsafe_rows(err) == []
    unpacked = f"{TO_CALLER}; its arguments are not a message, a type and a status"
    assert left(err) == [
        ("OMNI003", f"{TO_CALLER}; the call is awaited"),
        ("OMNI003", unpacked),
        ("OMNI003", unpacked),
        ("OMNI003", "the returned call is not where the statement says"),
    ]
