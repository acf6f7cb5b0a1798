"""The ``vllm-omni`` command: a thin dispatcher to lazily imported subcommands.

It must stay cheap to import: ``vllm-omni errors audit`` never loads vLLM or
torch, and ``vllm-omni serve`` pays for them only once it is chosen. The
audit is a tool installed on its own (``tools/errors_audit``); without it,
``vllm-omni errors audit`` says how to install it and exits 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from vllm_omni.version import __version__

# subcommand path -> "module:function"; each function takes argv and returns
# an exit code.
_COMMANDS: dict[tuple[str, ...], str] = {
    ("serve",): "vllm_omni.entrypoints.cli.serve:main",
    ("errors", "audit"): "vllm_omni_errors_audit.cli:main",
}
# Commands served by a tool installed on its own, not with the runtime:
# its import package -> how to install it from a checkout.
_TOOLS: dict[str, str] = {
    "vllm_omni_errors_audit": (
        "pip install -c requirements/lock.txt -e tools/errors_audit"
    ),
}

_OMNI_FLAG = "--omni"

_USAGE = """usage: vllm-omni <command> [options]

commands:
  serve          start the OpenAI-compatible server (vllm-omni serve --help)
  errors audit   inventory raw raise sites and error-handling anti-patterns
                 (vllm-omni errors audit --help)

options:
  -h, --help     show this message
  -V, --version  show vllm-omni's version
"""
_ERRORS_USAGE = """usage: vllm-omni errors <command> [options]

commands:
  audit   inventory raw raise sites and error-handling anti-patterns
          (vllm-omni errors audit --help)
"""
# Commands whose own word alone (or with --help) shows its usage.
_GROUP_USAGE = {("errors",): _ERRORS_USAGE}
_HELP = ("-h", "--help")


def _missing_tool(module_name: str) -> str | None:
    """How to install the tool that serves ``module_name`` when it is not
    installed; None when it is, or when the module is the runtime's own."""
    package = module_name.partition(".")[0]
    if package not in _TOOLS:
        return None
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as exc:
        # Only the tool itself missing: a module missing inside it is a
        # broken install, and its traceback says which.
        if exc.name != package:
            raise
        return _TOOLS[package]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv``; without ``argv`` (a console script, or
    ``vllm ... --omni``, whose CLI ignores what this returns) the command
    line's, exiting with its status."""
    if argv is None:
        sys.exit(_run(sys.argv[1:]))
    return _run(argv)


def _run(argv: Sequence[str]) -> int:
    # ``vllm serve MODEL --omni`` delegates here with its whole command line.
    args = [arg for arg in argv if arg != _OMNI_FLAG]
    for path, target in sorted(_COMMANDS.items(), key=lambda kv: -len(kv[0])):
        if tuple(args[: len(path)]) == path:
            module_name, func = target.split(":")
            install = _missing_tool(module_name)
            if install is not None:
                sys.stderr.write(
                    f"vllm-omni {' '.join(path)}: not installed (a tool of its "
                    f"own); from a vllm-omni checkout: {install}\n"
                )
                return 2
            handler = getattr(importlib.import_module(module_name), func)
            return int(handler(args[len(path) :]) or 0)
    if args[:1] in (["-V"], ["--version"]):
        sys.stdout.write(f"{__version__}\n")
        return 0
    for path, usage in _GROUP_USAGE.items():
        if tuple(args[: len(path)]) == path:
            rest = args[len(path) :]
            if rest[:1] and rest[0] in _HELP:
                sys.stdout.write(usage)
                return 0
            sys.stderr.write(usage)
            return 2
    if args[:1] and args[0] in _HELP:
        sys.stdout.write(_USAGE)
        return 0
    sys.stderr.write(_USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main())
