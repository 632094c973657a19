"""pyproject.toml: what `pip install glimmer` asks for and what the built wheel and sdist hold."""

import asyncio
import email
import json
import os
import socket
import threading
import time
import tomllib
import warnings
from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version

from glimmer.server.app import _RefuseWebSockets

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def built_metadata(tmp_path_factory) -> tuple[list[warnings.WarningMessage], email.message.Message, set[str]]:
    """The warnings the build backend gives while it writes the wheel's metadata, that metadata (METADATA) as `pip
    install` reads it, and the files the sdist holds (SOURCES.txt, paths from the repository root). In-process, as
    pip's build runs the backend: no build isolation, no network, so the venv's setuptools must be one the build
    asks for (pyproject's build-system)."""
    pytest.importorskip("setuptools", minversion="77")
    from setuptools import build_meta

    out = tmp_path_factory.mktemp("metadata")
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.chdir(ROOT)
        dist_info = build_meta.prepare_metadata_for_build_wheel(os.fspath(out))
    metadata = email.message_from_string((out / dist_info / "METADATA").read_text(encoding="utf-8"))
    sources = set((out / "glimmer.egg-info" / "SOURCES.txt").read_text(encoding="utf-8").splitlines())
    return caught, metadata, sources


def _dependency_floor(name: str) -> Version:
    """The lowest version of the base dependency `name` that pyproject.toml admits (its `>=` bound)."""
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == name:
            floors = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
            assert floors, f"{line}: no >= bound"
            return max(floors)
    raise AssertionError(f"{name} is not a dependency")


def test_pydantic_floor_is_the_first_release_that_applies_fail_fast_to_the_request_schemas_dicts():
    """The request schemas stop validating a list or dict at its first bad entry (`Field(fail_fast=True)` on
    `dict[str, float]` and `dict[str, str]`, glimmer/server/schemas.py). The floor was pydantic 2.6, so pip kept an
    installed 2.6 to 2.13: with 2.6 and 2.7 fail_fast was ignored (a long list of bad entries held the event loop
    for seconds again), with 2.8 to 2.13 `glimmer serve` ended at import in pydantic's traceback ("Unable to apply
    constraint 'fail_fast' to schema of type 'dict'"), and with 2.14.0 and 2.14.1 a logit_bias past its cap was named
    `logit_bias.4097` in the 400. 2.14.2 is the first release the schemas' tests pass with."""
    assert _dependency_floor("pydantic") >= Version("2.14.2")


def test_building_the_package_warns_of_nothing_the_build_backend_will_refuse(built_metadata):
    """`project.license` was a TOML table, `{ text = "Apache-2.0" }`: every build (pip install, pip wheel, python -m
    build) printed setuptools' boxed deprecation, which says builds with it stop working after 2027-02-18. It is the
    SPDX expression setuptools 77 and later take, written to the metadata as License-Expression."""
    caught, metadata, _ = built_metadata
    from setuptools import SetuptoolsDeprecationWarning

    assert [str(w.message) for w in caught if issubclass(w.category, SetuptoolsDeprecationWarning)] == []
    assert metadata["License-Expression"] == "Apache-2.0"
    backend_floor = Requirement(next(r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")))
    assert backend_floor.specifier.contains("77.0.0") and not backend_floor.specifier.contains("76.1.0")


def test_the_sdist_holds_the_test_suite_and_every_file_it_reads(built_metadata):
    """The sdist held setuptools' default of the sources: of tests/ only the seven tests/test_*.py files at its top,
    without conftest.py, their helpers or any test below, and none of the docs/, bench/, .ci/run or CHANGELOG.md
    those seven read, so `python -m pytest tests` in an unpacked sdist failed (test_docs.py: FileNotFoundError on
    docs/architecture.md). MANIFEST.in puts the suite and its files in it."""
    _, _, sources = built_metadata
    suite = [path for folder in ("tests", "docs", "bench") for path in (ROOT / folder).rglob("*")
             if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"]
    wanted = {path.relative_to(ROOT).as_posix() for path in suite} | {".ci/run", "CHANGELOG.md", "README.md"}
    assert sorted(wanted - sources) == []


def test_the_base_install_holds_a_websocket_library_so_a_handshake_is_refused_with_the_400():
    """A WebSocket handshake is answered with an OpenAI-style 400, `websocket_not_supported` (glimmer/server/app.py,
    _RefuseWebSockets), which uvicorn can send only with a WebSocket library installed. The test extras brought one
    (websockets, through openai-agents), the base install none: there uvicorn logged "Unsupported upgrade request"
    and "No supported WebSocket library detected. Please use pip install 'uvicorn[standard]'", and the handshake was
    a plain GET (/v1/realtime: 404; /v1/chat/completions: 405, method not allowed). wsproto is a dependency."""
    names = {Requirement(line).name for line in PYPROJECT["project"]["dependencies"]}
    assert names & {"wsproto", "websockets"}, sorted(names)


def test_a_websocket_handshake_is_refused_with_the_400_under_wsproto_the_base_install_s_library():
    """uvicorn picks websockets where it is installed (the test extras bring it), so the server tests' handshakes
    never ran under wsproto, the one WebSocket library the base install holds: the app's refusal served by uvicorn
    with ws="wsproto" must reach the client as the 400."""
    async def unreached(scope, receive, send):
        raise AssertionError(f"the {scope['type']} scope reached the app")

    listener = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(_RefuseWebSockets(unreached), ws="wsproto", lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=asyncio.run, args=(server.serve(sockets=[listener]),), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        with socket.create_connection(listener.getsockname(), timeout=10) as connection:
            connection.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
                               b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                               b"Sec-WebSocket-Version: 13\r\n\r\n")
            received = b"".join(iter(lambda: connection.recv(65536), b""))
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), received
    error = json.loads(body)["error"]
    assert error["code"] == "websocket_not_supported" and "asked at /v1/realtime" in error["message"], error


def test_torch_floor_is_the_first_release_with_the_attention_and_errors_the_model_calls():
    """Attention calls `F.scaled_dot_product_attention(..., enable_gqa=...)` (glimmer/model/kernels/paged_attention.py)
    and the engine catches `torch.OutOfMemoryError` (engine/working_memory.py): both came in torch 2.5. The floor
    was 2.4, so pip kept an installed torch 2.4, with which every prompt's attention ended in
    "scaled_dot_product_attention() got an unexpected keyword argument 'enable_gqa'"."""
    assert _dependency_floor("torch") >= Version("2.5")
