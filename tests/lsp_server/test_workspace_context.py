"""Issue 30: the real language server indexes the workspace folder in the background, and the definitions of the
names used near the cursor reach the engine as chunks of the request; files created and deleted on disk (the
client's file watching) come and go.

A fake engine on the server's socket records the prompts it is sent and answers each with nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import protocol
from diffgemma_lsp.repo import live
from tests.lsp.test_repo_context import GEOMETRY, MAIN, write
from tests.support.fake_engine import answering_empty, serving
from tests.support.lsp import complete, open_document, replace_text, server_command, span, start_client, status

pytestmark = pytest.mark.e2e


async def _until(
    client: LanguageClient,
    received: list[protocol.Infill],
    uri: str,
    line: int,
    column: int,
    done: Callable[[protocol.Infill], bool],
) -> protocol.Infill:
    """Ask for completions until the engine receives a request that ``done`` accepts (the index builds in the
    background)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        await complete(client, uri, line, column)
        if received and done(received[-1]):
            return received[-1]
        assert asyncio.get_running_loop().time() < deadline, received[-1].extra if received else "no request"
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _session(
    isolated_env: Path, workspace: Path, **settings: int
) -> AsyncIterator[tuple[LanguageClient, list[protocol.Infill], str]]:
    """The real language server on ``workspace`` with its app/main.py open, connected to a fake engine that records
    each request."""
    write(workspace, {"shapes/__init__.py": "", "shapes/geometry.py": GEOMETRY, "app/main.py": MAIN})
    uri = (workspace / "app" / "main.py").as_uri()
    socket_dir = isolated_env / "run"
    socket_dir.mkdir(mode=0o700)
    received: list[protocol.Infill] = []
    options = {"debounceMs": 0, "extraContextTokens": 0, "editHistoryTokens": 0, **settings}
    async with serving(socket_dir / "engine.sock", answering_empty(received)):
        client = await start_client(
            server_command(socket_dir / "engine.sock", None), init_options={"diffgemma": options}, root=workspace
        )
        try:
            open_document(client, uri, MAIN)
            yield client, received, uri
        finally:
            await client.shutdown_session()


def _chunk(request: protocol.Infill, filename: str) -> str | None:
    return next((chunk.text for chunk in request.extra if chunk.filename == filename), None)


async def test_definitions_from_the_workspace_reach_the_engine_and_follow_the_files_on_disk(
    isolated_env: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "project"
    volume = workspace / "shapes" / "volume.py"
    async with _session(isolated_env, workspace) as (client, received, uri):
        request = await _until(client, received, uri, 6, 23, lambda r: _chunk(r, "shapes/geometry.py") is not None)
        geometry = _chunk(request, "shapes/geometry.py")
        assert geometry is not None and "def area(width: float," in geometry and '"""Width times height."""' in geometry
        assert request.prefix.endswith("result += area(")

        volume.write_text("def volume(width, height, depth):\n    return width * height * depth\n")
        _watched(client, volume, types.FileChangeType.Created)
        replace_text(client, uri, 2, span(6, 0, 6, 0), "        size = volume(1, 2, 3)\n")  # used above the cursor
        request = await _until(client, received, uri, 7, 23, lambda r: _chunk(r, "shapes/volume.py") is not None)
        assert _chunk(request, "shapes/volume.py") == "def volume(width, height, depth):\n"

        volume.unlink()
        _watched(client, volume, types.FileChangeType.Deleted)
        await _until(client, received, uri, 7, 23, lambda r: _chunk(r, "shapes/volume.py") is None)


async def test_a_saved_document_is_indexed_from_its_text_at_once(isolated_env: Path, tmp_path: Path) -> None:
    """An open document is read again five seconds after typing stops, or at once when saved: a function the user
    just wrote in another file and saved is offered to the next completion that uses it."""
    workspace = tmp_path / "project"
    async with _session(isolated_env, workspace) as (client, received, uri):
        await _until(client, received, uri, 6, 23, lambda r: _chunk(r, "shapes/geometry.py") is not None)
        other = (workspace / "shapes" / "colour.py").as_uri()
        open_document(client, other, "")
        replace_text(client, other, 2, span(0, 0, 0, 0), "def shade(rgb):\n    return rgb\n")
        client.text_document_did_save(
            types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=other))
        )
        replace_text(client, uri, 2, span(6, 0, 6, 0), "        tint = shade(r)\n")
        started = asyncio.get_running_loop().time()
        request = await _until(client, received, uri, 7, 23, lambda r: _chunk(r, "shapes/colour.py") is not None)
        assert _chunk(request, "shapes/colour.py") == "def shade(rgb):\n"
        assert asyncio.get_running_loop().time() - started < live.REINDEX_DELAY_S  # the save, not the pause


def _watched(client: LanguageClient, path: Path, change: types.FileChangeType) -> None:
    event = types.FileEvent(uri=path.as_uri(), type=change)
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[event]))


async def test_no_index_and_no_chunk_with_the_workspace_context_off(isolated_env: Path, tmp_path: Path) -> None:
    async with _session(isolated_env, tmp_path / "project", repoContextTokens=0) as (client, received, uri):
        await _until(client, received, uri, 6, 23, lambda r: True)
        await asyncio.sleep(1.0)  # the time the index would have had
        await complete(client, uri, 6, 23)
        assert received[-1].extra == []


async def test_the_index_build_shows_files_indexed_of_files_found_and_the_status_says_it(
    isolated_env: Path, tmp_path: Path
) -> None:
    """Issue 46: the first completions of a big workspace have less repository context until the index is built;
    the build is shown as progress (files indexed of files found) and ``diffgemma.status`` says how far it got."""
    workspace = tmp_path / "project"
    write(workspace, {f"extra/module_{n}.py": f"def helper_{n}(x):\n    return x + {n}\n" for n in range(40)})
    async with _session(isolated_env, workspace) as (client, received, uri):
        await _until(client, received, uri, 6, 23, lambda r: _chunk(r, "shapes/geometry.py") is not None)
        found = 43  # the 40 modules, shapes/__init__.py, shapes/geometry.py, app/main.py
        deadline = asyncio.get_running_loop().time() + 30
        while not any(getattr(r, "kind", "") == "end" for rs in client.progress_reports.values() for r in rs):
            assert asyncio.get_running_loop().time() < deadline, client.progress_reports
            await asyncio.sleep(0.1)
        (reports,) = [
            rs for rs in client.progress_reports.values() if getattr(rs[0], "title", "") == "Indexing the workspace"
        ]
        assert reports[0].kind == "begin" and reports[-1].kind == "end" and reports[-1].message == f"{found} files"
        counts = [int(r.message.split(" of ")[0]) for r in reports[:-1] if r.message]
        assert counts == sorted(counts) and all(r.message.endswith(f" of {found} files") for r in reports[:-1])
        index = (await status(client))["workspaceIndex"]
        assert (index["indexed"], index["found"], index["files"], index["building"]) == (found, found, found, False)
