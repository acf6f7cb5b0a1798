"""``--fix`` keeps the status a client sees: 0.30's image route, run.

0.30.0's ``POST /v1/images/generations`` (``generate_images`` in
``entrypoints/openai/api_server.py``) wraps its body in ``except
HTTPException: raise`` before ``except Exception: raise HTTPException(500,
...)``, and the helpers it calls there raise ``HTTPException(400)``
(``_parse_lora_request`` in ``lora.py``, ``_check_max_generated_image_size``
in ``images/helpers.py``). The route and those helpers are taken, as
source, from the downloaded wheel and from a copy of it after ``--fix``
(no copy of them is kept here), executed, and served by real uvicorn
behind our error handling; the official OpenAI SDK calls each. Every
failure the route can meet before the engine answers gives the same
status and the same error object (its request id aside) before and after
``--fix``; with the widened clause put back as it was, three of them become
500s, which is what the widening prevents.
"""

from __future__ import annotations

import ast
import builtins
import logging
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

import vllm_omni.errors
from benchmarks.bench_audit import wheel_tree
from tests.e2e.servers import serve_in_thread
from vllm_omni.errors.http import install_error_handling

PACKAGE = "vllm_omni"
OPENAI = f"{PACKAGE}/entrypoints/openai"
# (file, function) taken from each tree, in the order they are defined.
TAKEN = (
    (f"{OPENAI}/image_api_utils.py", "parse_size"),
    (f"{OPENAI}/images/helpers.py", "_check_max_generated_image_size"),
    (f"{OPENAI}/lora.py", "_parse_lora_request"),
    (f"{OPENAI}/api_server.py", "generate_images"),
)
WIDENED = "    except (HTTPException, VLLMError):\n"
PUBLISHED = "    except HTTPException:\n"
MAX_PIXELS = 1024 * 1024


class _ChatHandler:
    """The multi-stage image path's chat handler; the engine fails."""

    async def generate_diffusion_images(self, **_: object) -> object:
        raise RuntimeError("the engine exploded")


def _parse_lora_request_upstream(body: dict[str, object]) -> object:
    """What the route's LoRA helper calls (``utils.parse_lora_request``):
    it refuses this body with a ``ValueError``."""
    raise ValueError(f"LoRA request is missing 'path': {sorted(body)}")


def _get_engine_and_model(raw_request: object) -> tuple[object, str, list[object]]:
    """Two stages: the route's multi-stage path (the chat handler)."""
    return object(), "m", [{"stage_id": 0}, {"stage_id": 1}]


def _unreached(name: str) -> Callable[..., object]:
    def unreached(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"{name} is not reached by these requests")

    return unreached


# scenario: (app state, request arguments, status)
SCENARIOS: dict[str, tuple[dict[str, object], dict[str, Any], int]] = {
    "chat handler missing": ({"openai_serving_chat": None}, {}, 503),
    "invalid LoRA": (
        {"openai_serving_chat": _ChatHandler()},
        {"extra_body": {"lora": {"name": "style"}}},
        400,
    ),
    "image too large": (
        {
            "openai_serving_chat": _ChatHandler(),
            "args": SimpleNamespace(max_generated_image_size=MAX_PIXELS),
        },
        {"size": "4096x4096"},
        400,
    ),
    "malformed size": ({"openai_serving_chat": _ChatHandler()}, {"size": "big"}, 400),
    "engine fails": ({"openai_serving_chat": _ChatHandler()}, {}, 500),
}
# Without the widened clause the helpers' and the route's own semantic
# errors meet ``except Exception`` and become 500s.
UNWIDENED = {
    "chat handler missing": 500,
    "invalid LoRA": 500,
    "image too large": 500,
}


def _function(
    tree: Path, relative: str, name: str
) -> ast.AsyncFunctionDef | ast.FunctionDef:
    module = ast.parse((tree / relative).read_bytes())
    found = next(
        node
        for node in module.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name == name
    )
    # Routed by the test app below (``with_cancellation`` is upstream's);
    # its annotations name the wheel's models, which are not loaded.
    found.decorator_list = []
    found.returns = None
    arguments = found.args
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
        argument.annotation = None
    return found


def _load(tree: Path, *, widened: bool = True) -> Callable[..., Any]:
    """``generate_images`` of ``tree``, executed with the helpers it calls
    there from the same tree; the rest of its module's names are ours
    (the errors package, FastAPI) or stand-ins that fail if reached."""
    functions = [_function(tree, relative, name) for relative, name in TAKEN]
    module = ast.Module(body=list(functions), type_ignores=[])
    source = ast.unparse(module)
    if not widened:
        assert source.count(WIDENED) == 1
        source = source.replace(WIDENED, PUBLISHED)
    namespace: dict[str, Any] = {
        "HTTPException": HTTPException,
        "HTTPStatus": HTTPStatus,
        "JSONResponse": JSONResponse,
        "logger": logging.getLogger("tests.fix_keeps_status"),
        "random": random,
        "time": time,
        "MAX_UINT32_SEED": 2**32 - 1,
        "random_uuid": lambda: uuid.uuid4().hex,
        "parse_lora_request": _parse_lora_request_upstream,
        "_get_engine_and_model": _get_engine_and_model,
    }
    code = compile(source, f"<{tree.name}: generate_images>", "exec", dont_inherit=True)
    free = {
        node.id
        for node in ast.walk(module)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    for name in sorted(free - set(namespace) - {f.name for f in functions}):
        if hasattr(builtins, name):
            continue
        # The errors package's names (its semantic types), by identity.
        namespace[name] = getattr(vllm_omni.errors, name, None) or _unreached(name)
    exec(code, namespace)
    return namespace["generate_images"]


def _fields(tree: Path) -> set[str]:
    """The request model's fields the route reads (``request.x``)."""
    route = _function(tree, f"{OPENAI}/api_server.py", "generate_images")
    return {
        node.attr
        for node in ast.walk(route)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "request"
    }


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The published tree and a copy of it after ``--fix``."""
    try:
        published = wheel_tree().parent
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the vllm-omni 0.30.0 wheel cannot be downloaded here: {exc}")
    fixed = tmp_path_factory.mktemp("fixed")
    shutil.copytree(published / PACKAGE, fixed / PACKAGE)
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "vllm_omni_errors_audit",
            PACKAGE,
            "--fix",
            "--no-cache",
        ],
        cwd=fixed,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    return published, fixed


@pytest.fixture(scope="module")
def base_url(trees: tuple[Path, Path]) -> Iterator[str]:
    published, fixed = trees
    routes = {
        "published": _load(published),
        "fixed": _load(fixed),
        "unwidened": _load(fixed, widened=False),
    }
    fields = _fields(published)
    app = FastAPI()
    install_error_handling(app)

    @app.post("/{tree}/{scenario}/v1/images/generations")
    async def images(tree: str, scenario: str, raw_request: Request) -> Any:
        body = await raw_request.json()
        request = SimpleNamespace(**(dict.fromkeys(fields) | {"n": 1} | body))
        state, _, _ = SCENARIOS[scenario]
        # The route reads the app's state (its handlers, its limits) and the
        # request's own state.
        proxy = SimpleNamespace(
            app=SimpleNamespace(state=SimpleNamespace(**state)),
            state=raw_request.state,
        )
        return await routes[tree](request, proxy)

    with serve_in_thread(app) as url:
        yield url


def _call(base_url: str, tree: str, scenario: str) -> openai.APIStatusError:
    client = openai.OpenAI(
        base_url=f"{base_url}/{tree}/{scenario}/v1", api_key="test", max_retries=0
    )
    _, arguments, _ = SCENARIOS[scenario]
    with pytest.raises(openai.APIStatusError) as caught:
        client.images.generate(model="m", prompt="a cat", **arguments)
    return caught.value


def _error(exc: openai.APIStatusError) -> dict[str, object]:
    body = exc.body
    assert isinstance(body, dict)
    return {key: value for key, value in body.items() if key != "request_id"}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_client_sees_the_same_status_and_error_after_fix(
    base_url: str, scenario: str
) -> None:
    published = _call(base_url, "published", scenario)
    fixed = _call(base_url, "fixed", scenario)
    status = SCENARIOS[scenario][2]
    assert published.status_code == fixed.status_code == status
    assert type(published) is type(fixed)
    assert _error(fixed) == _error(published)
    assert _error(fixed)["code"] == status


@pytest.mark.parametrize("scenario", list(UNWIDENED))
def test_without_the_widened_clause_the_same_requests_are_500s(
    base_url: str, scenario: str
) -> None:
    unwidened = _call(base_url, "unwidened", scenario)
    assert unwidened.status_code == UNWIDENED[scenario]
    assert isinstance(unwidened, openai.InternalServerError)
    message = _error(unwidened)["message"]
    assert isinstance(message, str)
    assert message.startswith("Image generation failed: ")


def test_the_fixed_route_raises_semantic_types(trees: tuple[Path, Path]) -> None:
    """What ran above is --fix's output: the route and both helpers raise
    the semantic types, and the route's clause lets them through."""
    published, fixed = trees

    def raised(tree: Path) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for relative, name in TAKEN:
            function = _function(tree, relative, name)
            found[name] = [
                ast.unparse(node.exc.func)
                for node in sorted(
                    (
                        node
                        for node in ast.walk(function)
                        if isinstance(node, ast.Raise)
                        and isinstance(node.exc, ast.Call)
                    ),
                    key=lambda node: node.lineno,
                )
            ]
        return found

    assert raised(published) == {
        "parse_size": ["ValueError"] * 4,
        "_check_max_generated_image_size": ["HTTPException"] * 2,
        "_parse_lora_request": ["HTTPException"],
        "generate_images": ["HTTPException"] * 6,
    }
    assert raised(fixed) == {
        "parse_size": ["ValueError"] * 4,
        "_check_max_generated_image_size": ["VLLMValidationError"] * 2,
        "_parse_lora_request": ["VLLMValidationError"],
        "generate_images": [
            "VLLMValidationError",
            "OmniServiceUnavailableError",
            "VLLMServerError",
            # ``except OmniClientError as e``: its status is e.status_code.
            "HTTPException",
            "VLLMValidationError",
            "VLLMServerError",
        ],
    }
    route = ast.unparse(_function(fixed, f"{OPENAI}/api_server.py", "generate_images"))
    assert route.count(WIDENED.strip()) == 1
