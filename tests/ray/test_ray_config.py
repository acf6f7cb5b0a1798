"""Selecting the Ray backend: pipeline YAML keys, engine arguments, CLI flags."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    NodeDiedError,
    OutOfMemoryError,
    RaySystemError,
    RayTaskError,
)

from vllm_omni.config import RayStageOptions, pipeline_from_mapping
from vllm_omni.engine.ray_backend import RayStageLauncher, describe_exit
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.cli.serve import make_parser
from vllm_omni.errors import OmniServiceUnavailableError, VLLMValidationError


def _doc(**extra: Any) -> dict[str, Any]:
    stage = {"id": 0, "kind": "text", **extra.pop("stage", {})}
    return {"model": "m", "stages": [stage], **extra}


def test_ray_keys_are_read() -> None:
    pipeline = pipeline_from_mapping(
        _doc(
            worker_backend="ray",
            ray_address="127.0.0.1:6379",
            stage_init_timeout_s=5,
            ray={"probe_interval_s": 0.5, "probe_timeout_s": 3},
            stage={
                "ray": {
                    "num_cpus": 1,
                    "num_gpus": 0.5,
                    "resources": {"node_a": 1},
                    "label_selector": {"zone": "a"},
                }
            },
        )
    )
    assert (
        pipeline.worker_backend,
        pipeline.ray_address,
        pipeline.stage_init_timeout_s,
    ) == ("ray", "127.0.0.1:6379", 5.0)
    assert (pipeline.ray_probe_interval_s, pipeline.ray_probe_timeout_s) == (0.5, 3.0)
    assert pipeline.stages[0].ray == RayStageOptions(
        num_cpus=1.0,
        num_gpus=0.5,
        resources={"node_a": 1.0},
        label_selector={"zone": "a"},
    )


def test_defaults_are_local_processes() -> None:
    pipeline = pipeline_from_mapping(_doc())
    assert (pipeline.worker_backend, pipeline.ray_address) == ("multi_process", None)
    assert pipeline.stages[0].ray == RayStageOptions()
    assert (pipeline.ray_probe_interval_s, pipeline.ray_probe_timeout_s) == (1.0, 2.0)


@pytest.mark.parametrize(
    ("extra", "parameter"),
    [
        ({"worker_backend": "dask"}, "worker_backend"),
        ({"ray_address": ""}, "ray_address"),
        ({"stage_init_timeout_s": 0}, "stage_init_timeout_s"),
        ({"stage_init_timeout_s": True}, "stage_init_timeout_s"),
        ({"ray": []}, "ray"),
        ({"ray": {"interval_s": 1}}, "ray.interval_s"),
        ({"ray": {"num_cpus": 1}}, "ray.num_cpus"),
        ({"ray": {"probe_interval_s": 0}}, "ray.probe_interval_s"),
        ({"ray": {"probe_timeout_s": -1}}, "ray.probe_timeout_s"),
        ({"ray": {"probe_timeout_s": "2"}}, "ray.probe_timeout_s"),
        ({"ray": {"probe_timeout_s": True}}, "ray.probe_timeout_s"),
        ({"stage": {"ray": []}}, "stages[0].ray"),
        ({"stage": {"ray": {"cpus": 1}}}, "stages[0].ray.cpus"),
        ({"stage": {"ray": {"num_cpus": -1}}}, "stages[0].ray.num_cpus"),
        ({"stage": {"ray": {"num_gpus": "1"}}}, "stages[0].ray.num_gpus"),
        ({"stage": {"ray": {"resources": {"a": 0}}}}, "stages[0].ray.resources"),
        ({"stage": {"ray": {"resources": ["a"]}}}, "stages[0].ray.resources"),
        (
            {"stage": {"ray": {"label_selector": {"zone": 1}}}},
            "stages[0].ray.label_selector",
        ),
    ],
)
def test_bad_ray_keys_name_their_path(extra: dict[str, Any], parameter: str) -> None:
    with pytest.raises(VLLMValidationError) as caught:
        pipeline_from_mapping(_doc(**extra))
    assert caught.value.parameter == parameter


def test_engine_arguments_override_the_pipeline() -> None:
    pipeline = pipeline_from_mapping(_doc(worker_backend="ray"))
    assert AsyncOmni(pipeline).worker_backend == "ray"
    assert AsyncOmni(pipeline, worker_backend="multi_process").worker_backend == (
        "multi_process"
    )
    with pytest.raises(VLLMValidationError) as caught:
        AsyncOmni(pipeline, worker_backend="dask")  # type: ignore[arg-type]
    assert caught.value.parameter == "worker_backend"


def _probe_of(engine: AsyncOmni) -> tuple[float, float]:
    launcher = engine._orchestrator.supervisor.launcher
    return launcher._probe_interval_s, launcher._probe_timeout_s  # type: ignore[union-attr]


def test_probe_settings_come_from_the_arguments_else_the_pipeline() -> None:
    pipeline = pipeline_from_mapping(
        _doc(worker_backend="ray", ray={"probe_interval_s": 0.5, "probe_timeout_s": 3})
    )
    assert _probe_of(AsyncOmni(pipeline)) == (0.5, 3.0)
    assert _probe_of(
        AsyncOmni(pipeline, ray_probe_interval_s=2, ray_probe_timeout_s=4)
    ) == (2.0, 4.0)


@pytest.mark.parametrize(
    ("ray_keys", "kwargs", "parameter"),
    [
        ({}, {"ray_probe_interval_s": 0}, "ray_probe_interval_s"),
        ({}, {"ray_probe_timeout_s": True}, "ray_probe_timeout_s"),
        # The heartbeat would declare the stage dead before its probe noticed.
        ({}, {"ray_probe_timeout_s": 10}, "ray_probe_timeout_s"),
        ({"probe_timeout_s": 5}, {"heartbeat_timeout_s": 5}, "ray.probe_timeout_s"),
    ],
)
def test_bad_probe_settings_name_where_they_came_from(
    ray_keys: dict[str, Any], kwargs: dict[str, Any], parameter: str
) -> None:
    pipeline = pipeline_from_mapping(_doc(worker_backend="ray", ray=ray_keys))
    with pytest.raises(VLLMValidationError) as caught:
        AsyncOmni(pipeline, **kwargs)
    assert caught.value.parameter == parameter


def test_serve_flags() -> None:
    args = make_parser().parse_args(
        ["--worker-backend", "ray", "--ray-address", "10.0.0.1:6379"]
    )
    assert (args.worker_backend, args.ray_address) == ("ray", "10.0.0.1:6379")
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--worker-backend", "dask"])


def _task_error() -> BaseException:
    """What ``ray.get`` raises for an exception inside an actor method."""
    return RayTaskError(
        "run",
        'Traceback (most recent call last):\n  File "/srv/omni/x.py", line 1',
        ValueError("boom"),
        ip="10.0.0.7",
        actor_id="ab12",
    ).as_instanceof_cause()


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (
            ActorDiedError(),
            None,
            "its Ray actor died (killed, node lost or out of memory) (ActorDiedError)",
        ),
        (
            ActorUnavailableError("node 10.0.0.7 unreachable", b"a" * 16),
            None,
            "its Ray actor became unreachable (ActorUnavailableError)",
        ),
        (
            NodeDiedError("node 10.0.0.7"),
            None,
            "its Ray node died (NodeDiedError)",
        ),
        (
            OutOfMemoryError("worker 10.0.0.7 killed"),
            None,
            "its Ray worker was killed for running out of memory (OutOfMemoryError)",
        ),
        (
            _task_error(),
            None,
            "the stage actor raised outside any request (RayTaskError(ValueError))",
        ),
        (
            RaySystemError("node 10.0.0.7 lost"),
            None,
            "its Ray run call failed with a system error (RaySystemError)",
        ),
        (KeyError("x"), None, "its Ray actor failed (KeyError)"),
        (None, 0, "stage actor exited with code 0 (its Ray node was lost)"),
        (None, 1, "stage actor exited with code 1"),
    ],
)
def test_exit_reasons_carry_no_ray_text(
    error: BaseException | None, code: int | None, reason: str
) -> None:
    assert describe_exit(error, code) == reason


def test_unreachable_cluster_fails_fast_without_its_address() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(OmniServiceUnavailableError) as caught:
        RayStageLauncher(address=address).prepare()
    assert time.monotonic() - started < 10
    assert (
        str(caught.value) == "The Ray cluster is unreachable (ConnectionRefusedError)."
    )
    assert address not in str(caught.value)
