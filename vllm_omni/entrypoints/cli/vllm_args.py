"""The ``vllm serve`` command line of ``vllm-omni serve``.

vLLM's own serve parser (``make_arg_parser``: its engine and frontend
arguments, ``--help`` included) with this project's options added, and what
the parsed arguments mean for a pipeline: the engine arguments go to its
``vllm`` stage (``check_model_pipeline``), the frontend arguments the server
honours go to the server, and every other argument given is refused in one
line that names it (docs/design.md §10). It imports vLLM's argument modules
(seconds): ``serve`` imports it only once this project's own options were
checked. It builds no engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser, SortedHelpFormatter

from vllm_omni.config import (
    PipelineConfig,
    PipelineConfigError,
    check_model_pipeline,
    check_pipeline,
)
from vllm_omni.entrypoints.cli.options import (
    DEFAULT_HOST,
    add_omni_options,
    default_api_key,
)

__all__ = ["HONOURED_FRONTEND", "CommandLineError", "Served", "make_parser", "resolve"]

# Where ``make_arg_parser`` lives: vLLM 0.33, then the 0.32 CPU build.
_UPSTREAM_CLI_ARGS = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
)
_USAGE_ERROR = 2

# Frontend arguments the server gives the meaning ``vllm serve`` gives them
# (``api_server.run_server`` / ``build_app``); any other frontend argument
# given is refused by name, never dropped.
HONOURED_FRONTEND = frozenset(
    {
        "host",
        "port",
        "api_key",
        "uvicorn_log_level",
        "disable_uvicorn_access_log",
        "allowed_origins",
        "allowed_methods",
        "allowed_headers",
        "allow_credentials",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
        "ssl_cert_reqs",
        "ssl_ciphers",
        "root_path",
        "h11_max_incomplete_event_size",
        "h11_max_header_count",
        # Always on here: every response carries X-Request-Id.
        "enable_request_id_headers",
        # API server processes in front of the pipeline (cli.api_servers).
        "api_server_count",
    }
)
# Parser entries that are neither engine nor frontend arguments.
_PARSER_ONLY = frozenset({"help", "model_tag", "config"})


class CommandLineError(Exception):
    """A command line that cannot be served; the message is the one line."""


_GROUPS_HELP = (
    "Each group's arguments: --help=<group>, e.g. --help=vllm-omni (this "
    "project's options), --help=request-limits, --help=Frontend, "
    "--help=ModelConfig. One argument: --help=<name>, e.g. --help=api-key. "
    "Every argument: --help=all."
)
_API_KEY_HELP = (
    "require 'Authorization: Bearer KEY' (or 'X-API-Key: KEY') on every "
    "route but /health and /metrics, the OpenAPI document and its pages "
    "included; several keys are accepted (default: $VLLM_OMNI_API_KEY, "
    "else no key)"
)


class _HelpFormatter(SortedHelpFormatter):
    """vLLM's help layout; an option whose help already says its default
    keeps that sentence alone (no second ``(default: ...)``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text:
            return text
        return super()._get_help_string(action)


class _OneLineParser(FlexibleArgumentParser):
    """An argument error is one line (``prog: error: ...``), no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(_USAGE_ERROR, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Served:
    """What a ``vllm serve`` command line asks for."""

    pipeline: str | PipelineConfig
    args: argparse.Namespace


def _use_cpu_platform_if_unspecified() -> None:
    """vLLM's engine arguments cannot be listed on a machine where vLLM finds
    no device (its config defaults infer one); as ``vllm bench`` does, the
    CPU platform stands in, so ``--help`` and argument errors still work
    there (the engine itself then fails to start, in vLLM's words)."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def _make_arg_parser() -> Any:
    for name in _UPSTREAM_CLI_ARGS:
        try:
            return importlib.import_module(name).make_arg_parser
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    raise ModuleNotFoundError(f"no make_arg_parser in {_UPSTREAM_CLI_ARGS}")


def make_parser(prog: str) -> FlexibleArgumentParser:
    """vLLM's serve parser with this project's options (its own ones win:
    ``--max-num-queued-reqs`` is admission control here, ``--log-level`` this
    server's log level)."""
    _use_cpu_platform_if_unspecified()
    parser = _OneLineParser(
        prog=prog,
        usage=f"{prog} [model_tag] [options]",
        description="Serve a model, or a multi-stage pipeline, over an "
        "OpenAI-compatible API: vLLM's serve arguments plus vllm-omni's own.",
        conflict_handler="resolve",
        # A misspelling that happens to be a prefix (``--max-num-seq``) is
        # refused, not taken for the option it abbreviates.
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
        epilog=_GROUPS_HELP,
    )
    _make_arg_parser()(parser)
    for action in parser._actions:
        if action.dest == "api_key":
            action.help = _API_KEY_HELP
    add_omni_options(parser)
    parser.set_defaults(host=DEFAULT_HOST, api_key=default_api_key())
    return parser


def _flag(parser: argparse.ArgumentParser, dest: str, argv: Sequence[str]) -> str:
    """The option of ``dest`` as the command line spelled it (``--enable-x``,
    not ``--disable-x``), else its longest spelling, else ``dest``."""
    typed = {arg.partition("=")[0].replace("_", "-") for arg in argv}
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            spelled = [o for o in action.option_strings if o in typed]
            return (spelled or [max(action.option_strings, key=len)])[0]
    return dest


def _given(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The arguments whose value is not the parser's default, in order."""
    return {
        dest: value
        for dest, value in vars(args).items()
        if value != parser.get_default(dest)
    }


def resolve(
    parser: argparse.ArgumentParser, argv: Sequence[str], own: Sequence[str]
) -> Served:
    """Parse ``argv`` (argparse exits with one line on an unknown argument or
    a bad value) and build the pipeline it asks for, or raise
    ``CommandLineError`` naming the first argument with no meaning for it.
    ``own`` are the dests of this project's options."""
    args = parser.parse_args(list(argv))
    given = _given(parser, args)
    model: str | None = given.pop("model_tag", None) or given.pop("model", None)
    given.pop("model", None)
    engine_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    names = given.pop("served_model_name", None)
    if names is not None and len(names) != 1:
        raise CommandLineError(
            "--served-model-name takes one name here (the pipeline's model)"
        )
    served_model_name = names[0] if names else None
    engine: dict[str, Any] = {}
    for dest, value in given.items():
        if dest in own or dest in HONOURED_FRONTEND or dest in _PARSER_ONLY:
            continue
        if dest not in engine_fields:
            raise CommandLineError(
                f"{_flag(parser, dest, argv)} is not supported by vllm-omni serve"
            )
        engine[dest] = value
    if model is None and not engine and served_model_name is None:
        return Served(pipeline=args.pipeline or "reference", args=args)
    try:
        # Without a model, the pipeline is the file's, or the reference one.
        spec = args.pipeline or (None if model else "reference")
        base = None if spec is None else check_pipeline(spec)
        pipeline = check_model_pipeline(
            model, engine, base=base, served_model_name=served_model_name
        )
    except PipelineConfigError as exc:
        flag = _flag(parser, exc.parameter, argv)
        message = str(exc)
        if flag != exc.parameter and exc.message.startswith(exc.parameter):
            message = flag + exc.message[len(exc.parameter) :]
        raise CommandLineError(message) from None
    return Served(pipeline=pipeline, args=args)
