"""What ``vllm-omni serve`` hands uvicorn, as ``vllm serve`` does."""

from __future__ import annotations

import argparse

import pytest

from vllm_omni.entrypoints.openai import api_server


def test_keep_alive_follows_vllms_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    assert api_server._uvicorn_options(argparse.Namespace()) == {
        "timeout_keep_alive": 5
    }
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "75")
    options = api_server._uvicorn_options(argparse.Namespace(ssl_keyfile="k.pem"))
    assert options == {"ssl_keyfile": "k.pem", "timeout_keep_alive": 75}
