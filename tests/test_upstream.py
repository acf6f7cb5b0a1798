"""``vllm_omni.upstream``: upstream's engine exceptions without their package.

Run in a fresh interpreter (this one has imported ``vllm.v1.engine`` long
ago): the server's modules must not load ``vllm.config`` (the 3–4 s that made
``vllm-omni serve`` 1.67x a bare ``import vllm``), and every way upstream and
this project reach ``EngineDeadError`` must give the one class.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

_PROBE = r"""
import json, pickle, sys
import vllm_omni.entrypoints.openai.api_server
from vllm_omni.errors.types import EngineDeadError, OmniEngineDeadError
out = {
    "config_loaded": "vllm.config" in sys.modules,
    "package_loaded": "vllm.v1.engine" in sys.modules,
    "launcher_loaded": "vllm.entrypoints.launchers.launcher" in sys.modules,
}
from vllm.v1.engine.exceptions import EngineDeadError as direct
import importlib
by_name = importlib.import_module("vllm.v1.engine.exceptions").EngineDeadError
dead = OmniEngineDeadError(stage_id=2, reason="gone")
out["same_class"] = direct is EngineDeadError and by_name is EngineDeadError
out["caught_as_upstream"] = isinstance(pickle.loads(pickle.dumps(dead)), direct)
# The real engine's modules, imported afterwards, see the same classes.
from vllm.v1.engine import core_client
import vllm.v1.engine
out["engine_same_class"] = core_client.EngineDeadError is EngineDeadError
out["attribute_set"] = vllm.v1.engine.exceptions.EngineDeadError is EngineDeadError
# Upstream's rule on a dead engine before its module is loaded: the call
# returns at once (the event loop is not blocked), a thread applies it.
import threading, time, types
from vllm_omni import upstream
server = types.SimpleNamespace(should_exit=False)
engine = types.SimpleNamespace(
    errored=True, is_running=False, should_keep_api_server_alive=False
)
upstream.terminate_if_errored(server=server, engine=engine)
out["exit_set_at_once"] = server.should_exit
deadline = time.monotonic() + 120
while not server.should_exit and time.monotonic() < deadline:
    time.sleep(0.05)
out["exit_set_by_thread"] = server.should_exit
out["launcher_rule"] = upstream.launcher().terminate_if_errored.__module__
print(json.dumps(out))
"""


def test_server_modules_skip_vllm_config_and_keep_one_class() -> None:
    env = dict(os.environ)
    env.pop("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", None)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "config_loaded": False,
        "package_loaded": False,
        "launcher_loaded": False,
        "same_class": True,
        "caught_as_upstream": True,
        "engine_same_class": True,
        "attribute_set": True,
        "exit_set_at_once": False,
        "exit_set_by_thread": True,
        "launcher_rule": "vllm.entrypoints.launchers.launcher",
    }


def test_project_never_imports_the_leaf_as_an_attribute_chain() -> None:
    """``import vllm.v1.engine.exceptions as m`` needs the package imported
    first (the one form ``engine_exceptions`` cannot serve); keep it out."""
    root = pathlib.Path(__file__).resolve().parents[1]
    statement = re.compile(r"^\s*import vllm\.v1\.engine\.exceptions", re.MULTILINE)
    offenders = [
        str(path.relative_to(root))
        for folder in ("vllm_omni", "tests", "benchmarks")
        for path in (root / folder).rglob("*.py")
        if statement.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
