"""What the fake engine raises, by name: the failures a real engine raises.

A request names its scenario in its request id (``X-Request-Id:
omni-fail-<name>-<n>``, the header vLLM's serving code takes the id from)
or in its prompt text (``omni-fail-<name>``: diffusion and video prompts
reach the engine as text). The engine runs only where a GPU would; every
route, handler and middleware in front of it is vllm-omni's own.
"""

from __future__ import annotations

import re
import uuid

# Planted in failures: none of it may reach a response body.
SECRET = "sk-proj-" + "Q7x2" * 8
PATH = "/opt/omni/models/secret_model/modeling_thing.py"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    f'  File "{PATH}", line 42, in forward\n'
    "    raise RuntimeError(...)"
)
# A rejected value echoed by a validation error.
REJECTED = "abc-not-a-number"

_MARK = re.compile(r"omni-fail-([a-z_]+)")

# name -> what the engine raises (built by the engine, which imports the
# tree's own exception types); ``after_first`` names raise after one output.
NAMES = (
    "ok",
    "value_error",
    "value_error_secret",
    "validation_top_k",
    "not_found",
    "generate_error",
    "runtime_secret",
    "guardrail",
    "dead",
)
AFTER_FIRST = ("stream_generate_error", "stream_runtime_secret")


def request_id(name: str) -> str:
    """A fresh request id that names ``name``."""
    return f"omni-fail-{name}-{uuid.uuid4().hex[:8]}"


def prompt(name: str) -> str:
    """A prompt text that names ``name``."""
    return f"omni-fail-{name} hello world"


def named(*texts: object) -> str:
    """The scenario a request names (``ok`` when it names none)."""
    for text in texts:
        found = _MARK.search(str(text))
        if found:
            return found.group(1)
    return "ok"
