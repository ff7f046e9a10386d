"""The session key each request to a completions server carries (``SESSION_HEADER``), so that a cache-aware router
in front of several replicas (vLLM's production-stack router with ``--routing-logic session --session-key
x-session-id``, or any proxy that hashes a header: Envoy, nginx, Caddy, Ray Serve) keeps one user's file, and so
its prompt head, on the replica that has it cached. Both processes send it: the engine to a vLLM at ``--vllm-url``
(and the one it starts), the language server's ``backend: openai``. Standard library only."""

from __future__ import annotations

import getpass
import hashlib

SESSION_HEADER = "x-session-id"


def session_key(uri: str, user: str | None = None) -> str:
    """A stable, opaque key for ``user``'s (default: this process's user) document ``uri`` (a file URI: its
    workspace's path and the file's): the same for every request of that file, different for another user or file,
    and naming neither."""
    who = user if user is not None else getpass.getuser()
    return hashlib.sha256(f"{who}\0{uri}".encode()).hexdigest()[:32]
