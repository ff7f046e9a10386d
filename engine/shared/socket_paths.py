"""The engine's socket: where it is for each model, and the checks that keep it between one user's processes.

Both processes use it: the engine to listen (``diffgemma_engine.service.server``), the language server to find and open
it (``diffgemma_lsp.backends``). Standard library only, like the wire (``diffgemma_engine.shared.protocol``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import stat
import struct
from collections.abc import Mapping
from pathlib import Path

from .frames import MAX_FRAME_BYTES

MAX_SOCKET_PATH_BYTES = 100
"""Unix socket paths are limited to 107 bytes; keep room for the socket's own name."""


class UnsafeSocketError(PermissionError):
    """A socket, its directory or the process behind it that another user could control."""


def _own_directory(path: Path) -> bool:
    """Whether ``path`` is a real directory (not a symlink) that belongs to this user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def runtime_dir() -> Path:
    """The per-user directory that holds the engine's socket (created 0700 by the engine).

    ``$XDG_RUNTIME_DIR/diffgemma`` when that directory is this user's; otherwise (ssh without pam_systemd,
    ``su``, cron, containers) a folder in the user's cache directory, where no other user can create it first;
    ``/tmp/diffgemma-<uid>`` only when that path would be too long for a socket (and then it is checked, and
    refused when another user made it).
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and _own_directory(Path(base)):
        return Path(base) / "diffgemma"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffgemma" / "run"
    if len(str(cache / "engine-000000000000.sock").encode()) <= MAX_SOCKET_PATH_BYTES:
        return cache
    return Path("/tmp") / f"diffgemma-{os.getuid()}"


def check_socket_dir(directory: Path) -> None:
    """``UnsafeSocketError`` unless ``directory`` is a real directory of this user's that no one else can write
    to (else another user could put their own socket there). ``FileNotFoundError`` when it does not exist."""
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeSocketError(f"the engine's socket directory {directory} is a symbolic link: refusing to use it")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeSocketError(f"the engine's socket directory {directory} is not a directory")
    if info.st_uid != os.getuid():
        raise UnsafeSocketError(
            f"the engine's socket directory {directory} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.getuid()}): another user may be listening there; set XDG_RUNTIME_DIR to a folder of your own, "
            "or choose another socket"
        )
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise UnsafeSocketError(
            f"the engine's socket directory {directory} can be written by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}): make it 0700"
        )


def is_listening(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def check_peer(sock: socket.socket) -> None:
    """``UnsafeSocketError`` unless the process behind ``sock`` runs as this user."""
    uid = peer_uid(sock)
    if uid != os.getuid():
        raise UnsafeSocketError(f"the process listening on the engine's socket runs as uid {uid}, not as this user")


async def open_engine(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the engine's socket, after checking its directory, and check that the engine is this user's:
    nothing of the user's code goes to a process another user runs."""
    check_socket_dir(path.parent)
    reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_FRAME_BYTES)
    try:
        check_peer(writer.get_extra_info("socket"))
    except UnsafeSocketError:
        writer.close()
        raise
    return reader, writer


def default_socket_path() -> Path:
    """Where the engine listens unless told otherwise: one engine per user."""
    return runtime_dir() / "engine.sock"


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
"""A hub model id, ``owner/name`` (``google/diffusiongemma-26B-A4B-it``), as huggingface_hub spells one."""


def is_hub_id(model: str) -> bool:
    """Whether a ``model`` setting names a hub id: it has the form ``owner/name`` and no folder of that name is
    here (a folder always wins, as in transformers' ``from_pretrained``)."""
    return (
        HUB_ID.fullmatch(model) is not None
        and ".." not in model
        and "--" not in model
        and not model.endswith(".git")
        and not Path(model).is_dir()
    )


SHIPPED_MODEL_ID = "default"
"""The model id the engine reports (``HelloOk.model_id``, ``Stats.model_id``) for the model shipped in the package."""


def model_identity(model: str | None) -> str:
    """What names the checkpoint of a ``model`` setting the same from every working directory: a hub id as
    written, a folder as its absolute path; "" for the shipped model."""
    if not model:
        return ""
    return model if is_hub_id(model) else str(Path(model).expanduser().resolve())


def socket_path_for(
    model: str | None, device: str = "auto", quantization: str = "", options: Mapping[str, str] | None = None
) -> Path:
    """The socket of the engine that serves ``model`` on ``device`` (``quantization``: as the engine's option, ""
    for the checkpoint's own; ``options``: its other options that are not their defaults, e.g. ``{"runtime":
    "vllm"}``): the per-user default for the shipped model on ``auto``, else one per (model, device, quantization,
    options), so that a changed setting reaches an engine that serves it."""
    given = "".join(f"\0{name}={value}" for name, value in sorted((options or {}).items()))
    if not model and device == "auto" and not quantization and not given:
        return default_socket_path()
    identity = f"{model_identity(model)}\0{device}" + (f"\0{quantization}" if quantization else "") + given
    key = hashlib.sha1(identity.encode()).hexdigest()[:12]
    return runtime_dir() / f"engine-{key}.sock"
