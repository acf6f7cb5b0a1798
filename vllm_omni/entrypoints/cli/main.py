"""The ``vllm-omni`` command: a thin dispatcher to lazily imported subcommands.

It must stay cheap to import: ``vllm-omni errors audit`` never loads vLLM or
torch, and ``vllm-omni serve`` pays for them only once it is chosen.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# subcommand path -> "module:function"; each function takes argv and returns
# an exit code.
_COMMANDS: dict[tuple[str, ...], str] = {
    ("serve",): "vllm_omni.entrypoints.cli.serve:main",
    ("errors", "audit"): "vllm_omni_errors_audit.cli:main",
}

_USAGE = """usage: vllm-omni <command> [options]

commands:
  serve          start the OpenAI-compatible server (vllm-omni serve --help)
  errors audit   inventory raw raise sites and error-handling anti-patterns
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for path, target in sorted(_COMMANDS.items(), key=lambda kv: -len(kv[0])):
        if tuple(args[: len(path)]) == path:
            module_name, func = target.split(":")
            handler = getattr(importlib.import_module(module_name), func)
            return int(handler(args[len(path) :]) or 0)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE)
        return 0
    sys.stderr.write(_USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main())
