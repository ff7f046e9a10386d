"""The engine's socket file: its private directory, the lock that keeps one engine per socket, the listener, and
listening again when a /tmp cleaner removes the file. It knows nothing of sessions: connections go to the handler
it is given (``diffgemma_engine.service.server.EngineServer``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ..shared import socket_paths

logger = logging.getLogger("diffgemma_engine.service.server")  # what it logs is the server's, as before the split

SOCKET_CHECK_S = 2.0
"""How often the engine checks that its socket file is still there (a /tmp cleaner may remove it)."""

ClientHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


class AlreadyRunningError(RuntimeError):
    """Another engine is listening on the socket."""


def prepare_socket_dir(path: Path, make_parents: bool = True) -> None:
    """Create the socket's directory 0700, or check the one there: a real directory (never a symlink followed)
    of this user's; the default runtime directory is made private if it is not, any other is refused if others
    can write to it (``socket_paths.UnsafeSocketError``). Without ``make_parents``, a directory whose parent is
    gone is not made (``FileNotFoundError``)."""
    directory = path.parent
    if make_parents:
        directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        raise socket_paths.UnsafeSocketError(f"socket directory {directory} is not a real directory: {exc}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise socket_paths.UnsafeSocketError(
                f"socket directory {directory} belongs to uid {info.st_uid}, not to this user: another user made it"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077 and directory == socket_paths.runtime_dir():
            os.fchmod(fd, 0o700)  # on the directory itself, not on whatever a path would lead to now
        elif mode & 0o022:
            raise socket_paths.UnsafeSocketError(
                f"socket directory {directory} can be written by others (mode {mode:o})"
            )
        elif mode & 0o077:
            logger.warning("socket directory %s is not private (mode %o)", directory, mode)
    finally:
        os.close(fd)


class SocketFile:
    """One engine's socket: claimed (directory checked, lock held, a stale file cleared), bound 0600, watched."""

    def __init__(self, handle: ClientHandler) -> None:
        self._handle = handle
        self._socket_id: tuple[int, int] | None = None
        self._server: asyncio.Server | None = None
        self._lock_file: int | None = None
        self.path: Path | None = None
        """Where it listens; None once the path is another process's (``close`` must not remove it then)."""

    def _take_lock(self, path: Path) -> None:
        """Hold the socket's lock file (created if missing); ``AlreadyRunningError`` if another engine holds it.
        A lock this engine holds on the same file is kept (a second ``flock`` would conflict with it)."""
        lock_path = path.with_name(path.name + ".lock")
        if self._lock_file is not None:
            held = os.fstat(self._lock_file)
            with contextlib.suppress(FileNotFoundError):
                current = os.lstat(lock_path)
                if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                    return
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise AlreadyRunningError(f"another engine is starting or running on {path}") from None
        if self._lock_file is not None:
            os.close(self._lock_file)
        self._lock_file = descriptor

    def _claim(self, path: Path, make_parents: bool = True) -> None:
        """Take the socket's lock and clear a stale socket file; ``AlreadyRunningError`` if an engine holds it."""
        prepare_socket_dir(path, make_parents)
        self._take_lock(path)
        if path.exists() or path.is_symlink():
            if socket_paths.is_listening(path):
                raise AlreadyRunningError(f"another engine is listening on {path}")
            path.unlink()

    async def _bind(self, path: Path) -> asyncio.Server:
        """Listen on ``path`` (0600); its identity is kept to notice when the file is removed or replaced."""
        old_umask = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self._handle, path=str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        info = os.lstat(path)
        self._socket_id = (info.st_dev, info.st_ino)
        return server

    async def start(self, path: Path) -> None:
        """Bind the socket (0600 in a 0700 directory); ``AlreadyRunningError`` if an engine holds it."""
        self._claim(path)
        self._server = await self._bind(path)
        self.path = path
        logger.info("listening on %s", path)

    async def watch(self, has_clients: Callable[[], bool], stop: Callable[[], None]) -> None:
        """Listen again when the socket file disappears (a /tmp cleaner): new clients would find no engine, and
        could start none while this one holds the lock. When another process has taken the path meanwhile, or the
        folder the socket's directory was in is gone too (the session's runtime directory at logout, a test's
        temporary folder: no client looks there any more), take no new clients and ``stop`` once the connected
        ones have left; such a folder is not made again."""
        while True:
            await asyncio.sleep(SOCKET_CHECK_S)
            path = self.path
            if path is None:
                if not has_clients():
                    logger.info("the socket is another engine's now and no client is left: exiting")
                    stop()
                    return
                continue
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                info = None
            if info is not None and (info.st_dev, info.st_ino) == self._socket_id:
                continue
            try:
                if info is not None:
                    raise AlreadyRunningError(f"{path} was replaced by another process's file")
                self._claim(path, make_parents=False)
                server = await self._bind(path)
            except (AlreadyRunningError, OSError) as exc:
                logger.warning("socket %s is gone and cannot be taken again (%s): taking no new clients", path, exc)
                self._stop_listening()
                continue
            logger.warning("socket %s was removed: listening on it again", path)
            if self._server is not None:
                self._server.close()  # the old listener, on a file that is gone; its connections stay
            self._server = server

    def _stop_listening(self) -> None:
        """Take no new clients, and leave the path to whoever has it now."""
        if self._server is not None:
            self._server.close()
        self._server = None
        self.path = None  # not ours any more: close() must not remove it

    def stop_accepting(self) -> None:
        """Close the listener (the connections it made stay)."""
        if self._server is not None:
            self._server.close()

    def remove(self) -> None:
        """Remove the socket file (when it is still this engine's) and let the lock go."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None
