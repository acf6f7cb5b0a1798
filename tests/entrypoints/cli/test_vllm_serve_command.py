"""``vllm serve MODEL --omni`` and ``vllm-omni serve MODEL``: vLLM's own serve
parser plus this project's options.

What a command line asks for is a table (``resolve`` with upstream's parser,
built once for the module); the promises to an operator run the installed
console scripts: vLLM's CLI reaches this one and its exit status is ours, an
argument that has no meaning is refused in one line naming it, a mistake in
this project's own options still fails before vLLM is imported, and a server
started with vLLM's frontend arguments honours them (openai SDK, real
uvicorn).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.omni_server import (
    REFERENCE_STAGES,
    Background,
    OmniServer,
    console_script,
    start_command,
    start_in_background,
)

pytestmark = pytest.mark.timeout(600)

PROG = "vllm-omni serve: error: "
# A mistake in this project's own options fails before vLLM is imported.
FAST_S = 3.0


@pytest.fixture(scope="module")
def parser() -> Any:
    from vllm_omni.entrypoints.cli import vllm_args

    return vllm_args.make_parser("vllm-omni serve")


@pytest.fixture(scope="module")
def own() -> set[str]:
    from vllm_omni.entrypoints.cli.serve import make_parser

    return {action.dest for action in make_parser()._actions}


@pytest.fixture
def vllm_pipeline(tmp_path: Path) -> Path:
    """A pipeline file with one vllm stage behind the reference guardrail."""
    stages = [
        REFERENCE_STAGES[0],
        {
            "id": 1,
            "name": "thinker",
            "kind": "vllm",
            "options": {"engine_args": {"model": "file/model", "max_model_len": 64}},
        },
    ]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"model": "from-file", "stages": stages}))
    return path


def _resolve(parser: Any, own: set[str], *argv: str) -> Any:
    from vllm_omni.entrypoints.cli import vllm_args

    return vllm_args.resolve(parser, list(argv), own)


def test_a_model_alone_is_one_vllm_stage_without_a_guardrail(
    parser: Any, own: set[str]
) -> None:
    served = _resolve(
        parser,
        own,
        "org/model",
        "--max-model-len",
        "128",
        "--dtype",
        "float32",
        "--served-model-name",
        "tiny",
        "--api-key",
        "k1",
        "k2",
        "--uvicorn-log-level",
        "warning",
        "--error-mode",
        "legacy",
    )
    pipeline = served.pipeline
    assert pipeline.model == "tiny"
    (stage,) = pipeline.stages  # no guardrail stage: none was configured
    assert (stage.kind, stage.in_process) == ("vllm", True)
    assert stage.options["engine_args"] == {
        "model": "org/model",
        "max_model_len": 128,
        "dtype": "float32",
    }
    args = served.args
    assert (args.api_key, args.uvicorn_log_level, args.error_mode) == (
        ["k1", "k2"],
        "warning",
        "legacy",
    )


def test_a_pipeline_file_gives_the_model_and_engine_arguments_to_its_vllm_stage(
    parser: Any, own: set[str], vllm_pipeline: Path
) -> None:
    served = _resolve(
        parser, own, "--pipeline", str(vllm_pipeline), "--max-model-len", "32"
    )
    guardrail, thinker = served.pipeline.stages
    assert guardrail.kind == "guardrail"
    assert thinker.options["engine_args"] == {
        "model": "file/model",
        "max_model_len": 32,
    }
    assert served.pipeline.model == "from-file"


@pytest.mark.parametrize(
    ("argv", "pipeline", "model"),
    [
        ((), "reference", None),
        (("--pipeline", "reference", "--error-mode", "legacy"), "reference", None),
        (("--served-model-name", "ref"), "builtin:reference", "ref"),
    ],
)
def test_without_a_model_the_pipeline_is_served(
    parser: Any,
    own: set[str],
    argv: tuple[str, ...],
    pipeline: str,
    model: str | None,
) -> None:
    served = _resolve(parser, own, *argv)
    if model is None:
        assert served.pipeline == pipeline
    else:
        assert (served.pipeline.source, served.pipeline.model) == (pipeline, model)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--pipeline", "reference", "--max-model-len", "128"),
            "--max-model-len cannot be used with pipeline builtin:reference: it "
            "has no vllm stage to give it to",
        ),
        (
            ("--pipeline", "reference", "org/model"),
            "--model cannot be used with pipeline builtin:reference: it has no "
            "vllm stage to give it to",
        ),
        (
            ("org/model", "--middleware", "my.Middleware"),
            "--middleware is not supported by vllm-omni serve",
        ),
        (
            ("org/model", "--headless"),
            "--headless is not supported by vllm-omni serve",
        ),
        (
            ("org/model", "--served-model-name", "a", "b"),
            "--served-model-name takes one name here (the pipeline's model)",
        ),
    ],
)
def test_an_argument_with_no_meaning_here_is_refused_by_name(
    parser: Any, own: set[str], argv: tuple[str, ...], message: str
) -> None:
    from vllm_omni.entrypoints.cli import vllm_args

    with pytest.raises(vllm_args.CommandLineError) as caught:
        _resolve(parser, own, *argv)
    assert str(caught.value) == message


def _run(*argv: str, timeout: float = 300.0) -> tuple[int, str, str, float]:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(PROG)]


def test_own_option_mistake_fails_before_vllm_is_imported(tmp_path: Path) -> None:
    code, _, stderr, took = _run(
        console_script("vllm-omni"),
        "serve",
        "org/model",
        "--max-model-len",
        "128",
        "--error-mode",
        "lenient",
        "--job-store",
        str(tmp_path / "jobs"),
    )
    assert code == 2 and took < FAST_S, (took, stderr)
    assert stderr == (
        f"{PROG}argument --error-mode: invalid choice: 'lenient' "
        "(choose from 'strict', 'legacy')\n"
    )


def test_enable_request_id_headers_is_accepted_it_is_always_on_here(
    parser: Any, own: set[str]
) -> None:
    served = _resolve(parser, own, "org/model", "--enable-request-id-headers")
    assert served.args.enable_request_id_headers is True


@pytest.mark.parametrize("spelling", [("--api-server-count", "3"), ("-asc", "3")])
def test_api_server_count_is_honoured_on_both_parsers(
    parser: Any,
    own: set[str],
    spelling: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """vLLM's spellings, with a model (vLLM's parser) and without (the light
    one); a count below 1 (vLLM's headless mode) is refused in one line."""
    from vllm_omni.entrypoints.cli import serve

    served = _resolve(parser, own, "org/model", *spelling)
    assert served.args.api_server_count == 3
    light = serve._parse(["--pipeline", "reference", *spelling])
    assert light.api_server_count == 3
    with pytest.raises(SystemExit) as exited:
        serve._parse(["org/model", "--api-server-count", "0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"{PROG}argument --api-server-count/-asc: must be a positive integer\n"
    )


def _help(parser: Any, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(list(argv))
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_says_how_to_open_each_group(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` lists the groups and says how to open one; this project's
    group lists its options, with each default said once."""
    from vllm_omni.entrypoints.cli import vllm_args

    parser = vllm_args.make_parser("vllm-omni serve")
    overview = _help(parser, capsys, "--help")
    assert "--help=<group>" in overview and "--help=vllm-omni" in overview
    assert "--help=all" in overview
    groups = overview.split("Config Groups:", 1)[1]
    assert "vllm-omni" in groups and "request-limits" in groups
    ours = _help(parser, capsys, "--help=vllm-omni")
    for option in ("--pipeline", "--error-mode", "--worker-backend", "--job-store"):
        assert option in ours, option
    limits = _help(parser, capsys, "--help=request-limits")
    assert "--max-request-bytes" in limits
    every = _help(parser, capsys, "--help=all")
    for text in (ours, limits, every):
        flat = " ".join(text.split())
        assert re.findall(r"default[^()]*\) \(default:", flat) == []
    key = " ".join(_help(parser, capsys, "--help=api-key").split())
    assert "$VLLM_OMNI_API_KEY" in key and "/invocations" not in key


@pytest.mark.parametrize(
    ("argv", "out"),
    [
        (("--version",), "0."),
        (("-V",), "0."),
        (("errors", "--help"), "vllm-omni errors audit --help"),
        (("--help",), "vllm-omni serve --help"),
    ],
)
def test_the_commands_own_help_and_version(argv: tuple[str, ...], out: str) -> None:
    from vllm_omni.version import __version__

    code, stdout, stderr, _ = _run(console_script("vllm-omni"), *argv, timeout=60)
    assert code == 0, stderr
    assert out in stdout
    if "--version" in argv or "-V" in argv:
        assert stdout == f"{__version__}\n"


ORIGIN = "http://app.example"


@dataclass
class _VllmCommands:
    misspelled: Background
    help_all: Background
    frontend: OmniServer


@pytest.fixture(scope="module")
def vllm_commands(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_VllmCommands]:
    """The commands that import vLLM (seconds of CPU each), started together
    when the first of their tests starts, after the tests that time a command
    (an import beside them would slow those); each test waits for its own.
    ``frontend``: the reference pipeline (no weights) started with ``vllm
    serve --omni`` and vLLM's frontend arguments, not yet ready."""
    directory = tmp_path_factory.mktemp("vllm-commands")
    misspelled = start_in_background(
        directory,
        "misspelled",
        console_script("vllm"),
        "serve",
        "org/model",
        "--omni",
        "--max-modle-len",
        "128",
        "--job-store",
        str(directory / "jobs"),
    )
    help_all = start_in_background(
        directory,
        "help-all",
        sys.executable,
        "-m",
        "vllm_omni.entrypoints.cli.main",
        "serve",
        "--help=all",
    )
    frontend = start_command(
        directory / "frontend",
        (console_script("vllm"), "serve"),
        "--omni",
        "--served-model-name",
        "omni-ref",
        "--api-key",
        "key-one",
        "key-two",
        "--allowed-origins",
        f'["{ORIGIN}"]',
        "--uvicorn-log-level",
        "warning",
    )
    try:
        yield _VllmCommands(misspelled, help_all, frontend)
    finally:
        for started in (frontend, misspelled, help_all):
            started.stop()


def test_vllm_serve_omni_reaches_this_cli_and_exits_with_its_status(
    vllm_commands: _VllmCommands,
) -> None:
    """The installed ``vllm`` script delegates ``--omni`` to this project; a
    misspelled engine argument is one line naming it and exit status 2."""
    code, _, stderr = vllm_commands.misspelled.result()
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    assert _error_lines(stderr) == [
        f"{PROG}unrecognized arguments: --max-modle-len 128"
    ]


def test_help_lists_vllm_serve_arguments_and_this_projects(
    vllm_commands: _VllmCommands,
) -> None:
    code, stdout, stderr = vllm_commands.help_all.result()
    assert code == 0, stderr[-3000:]
    for option in (
        "--max-model-len",
        "--served-model-name",
        "--uvicorn-log-level",
        "--allowed-origins",
        "--pipeline",
        "--error-mode",
        "--job-store",
        "--max-request-bytes",
    ):
        assert option in stdout, option


@pytest.fixture(scope="module")
def frontend_server(vllm_commands: _VllmCommands) -> OmniServer:
    """The ``vllm serve --omni`` server with vLLM's frontend arguments, ready
    (stopped with the module's other commands)."""
    vllm_commands.frontend.wait_ready(timeout=300)
    return vllm_commands.frontend


def test_frontend_arguments_behave_as_in_vllm_serve(
    frontend_server: OmniServer,
) -> None:
    base = frontend_server.base_url
    for key in ("key-one", "key-two"):
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["omni-ref"]
        reply = client.chat.completions.create(
            model="omni-ref", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content
    stranger = openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    preflight = httpx.options(
        base + "/v1/models",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    elsewhere = httpx.options(
        base + "/v1/models",
        headers={
            "Origin": "http://evil.example",
            "Access-Control-Request-Method": "GET",
        },
    )
    assert "access-control-allow-origin" not in elsewhere.headers


def test_the_server_runs_on_uvloop_with_its_start_up_heap_frozen(
    frontend_server: OmniServer,
) -> None:
    frontend_server.wait_for_log(
        r"vllm-omni serving omni-ref on http://127\.0\.0\.1:\d+ "
        r"\(error mode strict, event loop uvloop\)",
        r"froze [1-9]\d* start-up objects out of GC",
        within_s=30,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("--pipeline", "reference"),
        ("org/model", "--max-model-len", "64"),
    ],
)
def test_otlp_traces_endpoint_is_vllms_flag_and_applies_to_every_pipeline(
    parser: Any, own: set[str], argv: tuple[str, ...]
) -> None:
    """vLLM's own ``--otlp-traces-endpoint``: never refused (a pipeline
    without a vllm stage traces too); the engine gets it from the engine
    client (``config.with_traces_endpoint``), with every stage."""
    served = _resolve(parser, own, *argv, "--otlp-traces-endpoint", "http://c:4317")
    assert served.args.otlp_traces_endpoint == "http://c:4317"
    if not isinstance(served.pipeline, str):
        (stage,) = served.pipeline.stages
        assert "otlp_traces_endpoint" not in stage.options["engine_args"]
