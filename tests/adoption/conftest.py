"""The contract's tests against vllm-omni 0.30.0's own app (issue 44).

They run in the adoption environment (requirements/vllm-omni-030.sh) on a
vllm-omni tree named by ``VLLM_OMNI_ADOPTION_TREE``: the pristine 0.30.0
source or the same with the patch series of ``adoption/`` applied
(``tools/adoption.py`` builds both; ``.ci/vllm-omni-030`` runs this folder
on each). Elsewhere, the main suite included, every test here is skipped,
saying so.

``VLLM_OMNI_ADOPTION_FLAVOUR=pristine`` holds the pristine tree to
``pristine.py``: each test listed there must fail, with a message matching
its documented reason; one that passes, or fails differently, fails.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

# tests/ports.py, read by its path: here ``tests`` is vllm-omni's own test
# package (the trees under test come first on the path), not this project's.
free_port = runpy.run_path(str(Path(__file__).resolve().parents[1] / "ports.py"))[
    "free_port"
]

HERE = Path(__file__).resolve().parent
TREE_ENV = "VLLM_OMNI_ADOPTION_TREE"
FLAVOUR_ENV = "VLLM_OMNI_ADOPTION_FLAVOUR"
SKIP_REASON = (
    f"needs the vllm-omni 0.30.0 environment and a tree in ${TREE_ENV} "
    "(requirements/vllm-omni-030.sh; run .ci/vllm-omni-030)"
)
STARTUP_S = 240.0

sys.path.append(str(HERE))


def tree() -> Path | None:
    given = os.environ.get(TREE_ENV)
    return Path(given).resolve() if given else None


def flavour() -> str:
    return os.environ.get(FLAVOUR_ENV, "patched")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "adoption: a test of vllm-omni 0.30's own app")
    if tree() is not None:
        import cpu

        cpu.prepare()


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    ours = [item for item in items if Path(str(item.path)).parent == HERE]
    if tree() is None:
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
        return
    import vllm_omni

    where = Path(vllm_omni.__file__).resolve()
    if tree() not in where.parents:
        raise pytest.UsageError(
            f"vllm_omni is imported from {where}, not from {tree()}: put the "
            "tree first on PYTHONPATH"
        )
    whole = {Path(str(item.path)) for item in ours} == set(HERE.glob("test_*.py"))
    if flavour() == "pristine" and whole and not config.getoption("keyword"):
        from pristine import EXPECTED

        names = {item.name for item in ours}
        unknown = sorted(set(EXPECTED) - names)
        if unknown:
            raise pytest.UsageError(
                f"pristine.py lists tests that do not exist: {unknown}"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    if flavour() != "pristine" or call.when != "call":
        return
    from pristine import EXPECTED

    expected = EXPECTED.get(item.name)
    if expected is None:
        return
    report = outcome.get_result()
    reason, pattern = expected
    if report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.name} is listed in pristine.py as failing on the pristine "
            f"tree ({reason}) but passed: update the list"
        )
    elif report.failed:
        text = str(report.longrepr)
        if re.search(pattern, text):
            report.outcome = "skipped"
            report.wasxfail = reason
        else:
            report.longrepr = (
                f"{text}\n\npristine.py expects this failure to match "
                f"{pattern!r} ({reason}); it failed differently"
            )


class OmniServer:
    """One ``omni_server.py`` process: vllm-omni's app on a loopback port."""

    def __init__(self, pipeline: str, model: Path, log: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(tree()), env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "omni_server.py"),
                "--pipeline",
                pipeline,
                "--model",
                str(model),
                "--port",
                str(self.port),
            ],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"omni_server exited:\n{self.log.read_text()[-4000:]}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"omni_server not ready in {STARTUP_S} s:\n{self.log.read_text()[-4000:]}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tiny_model as maker

    return maker.make(tmp_path_factory.mktemp("tiny-model"))


def _server(
    pipeline: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OmniServer]:
    server = OmniServer(
        pipeline, tiny_model, tmp_path_factory.mktemp(pipeline) / "server.log"
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llm_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OmniServer]:
    """vllm-omni's app for an LLM pipeline (one comprehension stage)."""
    yield from _server("llm", tiny_model, tmp_path_factory)


@pytest.fixture(scope="session")
def diffusion_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OmniServer]:
    """vllm-omni's app for a pure diffusion pipeline with video output."""
    yield from _server("diffusion", tiny_model, tmp_path_factory)


@pytest.fixture
def fresh_llm_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OmniServer]:
    """A server of its own, for a test that kills its engine."""
    yield from _server("llm", tiny_model, tmp_path_factory)
