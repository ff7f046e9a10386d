"""Security: no TCP listener, and no document text in the logs unless debug logging is on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.e2e.test_lsp_engine import _engine_pid, _kill_engine
from tests.support.lsp import complete_when_ready, open_document, server_command, start_client
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
SECRET = "TOKEN_d0c5_must_not_be_logged"


def _listening_tcp_ports(pid: int) -> list[str]:
    """TCP sockets in LISTEN state that the process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                listening.append(fields[1])
    return listening


async def test_no_tcp_listener_and_no_document_text_in_logs(isolated_env: Path, memorized_model_dir: Path) -> None:
    socket_path = isolated_env / "run" / "engine.sock"
    lsp_log = isolated_env / "lsp.log"
    command = [*server_command(socket_path, memorized_model_dir), "--log-file", str(lsp_log)]
    client = await start_client(command, init_options={"debounceMs": 0, "extraContextTokens": 0})
    try:
        uri = "file:///work/secret.py"
        open_document(client, uri, f"# {SECRET}\n" + MEMORIZED_PREFIX + MEMORIZED_SUFFIX)
        result = await complete_when_ready(client, uri, 2, 0)
        assert result.items, "the completion never arrived"
        engine_pid = _engine_pid(socket_path)
        assert engine_pid is not None
        assert _listening_tcp_ports(engine_pid) == []
        server_pid = client._server.pid  # type: ignore[attr-defined]
        assert _listening_tcp_ports(server_pid) == []
    finally:
        await client.shutdown_session()
        _kill_engine(socket_path, signal.SIGTERM)
    engine_log = (isolated_env / "xdg_state_home" / "diffgemma" / "engine.log").read_text()
    for name, text in (("language server", lsp_log.read_text()), ("engine", engine_log)):
        assert "request" in text, f"the {name} log is empty"
        assert SECRET not in text and MEMORIZED_MIDDLE not in text, f"document text in the {name} log"
