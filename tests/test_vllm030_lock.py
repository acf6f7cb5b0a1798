"""The vLLM 0.30 lock (``requirements/vllm-030.lock``, the errors package's
suite on the oldest vLLM it supports) pins vllm 0.30.0, covers this
project's runtime and test requirements (vllm and Ray aside: the errors
suite needs neither 0.33 nor a Ray worker), holds each at the main lock's
version where vLLM 0.30 allows it, and holds none of the index's CUDA-built
torch companions (transformers would import torchvision next to a CPU
torch: ``operator torchvision::nms does not exist``). It is installed with
``--no-deps``, so a missing pin would be a missing package on a new
machine."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "vllm-030.lock"
MAIN_LOCK = ROOT / "requirements" / "lock.txt"
# Where vLLM 0.30.0's own requirements hold another version than the main
# lock's (none today; a re-resolve that moves one must say so here).
DIFFERENT_FROM_MAIN: set[str] = set()


def _pins(lock: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.strip().partition("==")
            assert sep, f"lock line is not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_vllm_and_torch_are_pinned_and_cuda_companions_absent() -> None:
    pins = _pins(LOCK)
    assert pins["vllm"] == Version("0.30.0")
    # vllm 0.30.0 pins torch==2.13.0; no local label: it resolves to the
    # +cpu wheel of /opt/wheels where there is one.
    assert pins["torch"] == Version("2.13.0")
    assert not {"torchvision", "torchaudio", "torchcodec", "vllm-omni"} & set(pins)


def _ours() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["test"]
    return [
        requirement
        for requirement in map(Requirement, specs)
        if canonicalize_name(requirement.name) not in ("vllm", "vllm-omni")
    ]


def test_the_lock_covers_our_runtime_and_test_requirements() -> None:
    pins = _pins(LOCK)
    main = _pins(MAIN_LOCK)
    requirements = _ours()
    assert {"fastapi", "pytest", "hypothesis", "openai"} <= {
        canonicalize_name(r.name) for r in requirements
    }
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in {LOCK.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} does not satisfy {requirement}"
        )
        if name not in DIFFERENT_FROM_MAIN:
            assert pins[name] == main[name], (name, pins[name], main[name])
