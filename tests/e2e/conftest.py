"""Session-wide real servers for the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.omni_server import OmniServer, start_server, write_pipeline

API_KEY = "test-key-0123456789"


@pytest.fixture(scope="session")
def omni_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServer]:
    """One ``vllm-omni serve`` on the reference stages plus fault markers,
    behind an API key, shared by every e2e module that needs a healthy server."""
    directory = tmp_path_factory.mktemp("omni-server")
    server = start_server(directory, write_pipeline(directory), api_key=API_KEY)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
