"""A local stand-in for the Hugging Face Hub's HTTP API, for tests of the engine's hub ids and ``pull``.

It is a stand-in because no machine here reaches the hub: the real huggingface_hub client (``HF_ENDPOINT`` set to
:attr:`StandInHub.url`) talks to it over HTTP, and it answers the calls that client makes for
``snapshot_download`` and ``hf_hub_download`` (huggingface_hub 2.4's ``hf_api.py``, ``_snapshot_download.py`` and
``file_download.py``), with the headers it reads:

* ``GET /api/models/{id}/revision/{rev}``: the model's info; ``sha`` is the commit a branch resolves to;
* ``GET /api/models/{id}/tree/{rev}?recursive=...``: every file with its size, git blob id and (for weights)
  ``lfs`` sha256 and size, in one page;
* ``HEAD``/``GET /{id}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (``X-Linked-Etag`` and
  ``X-Linked-Size`` for an LFS file, as the hub sends them), ``Content-Length``, ``Accept-Ranges``; a ``Range``
  request answered 206 with ``Content-Range``;
* an unknown repository or file: 404 with the hub's ``X-Error-Code`` (``RepoNotFound``, ``EntryNotFound``).

Every request is recorded (:attr:`StandInHub.requests`). Faults for the resume tests: ``refuse`` (file names
answered 403 on GET, once every other file the engine's ``pull`` asks for has been asked for: huggingface_hub
cancels the downloads not yet started when one fails, so an earlier refusal would leave a different part of the
snapshot each run) and ``cut_once`` (file name -> bytes sent before the connection is dropped, once)."""

from __future__ import annotations

import fnmatch
import hashlib
import http.server
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

LFS_SUFFIXES = (".safetensors",)


@attrs.frozen
class Request:
    """One request the stand-in hub answered."""

    method: str
    path: str
    range: str | None

    @property
    def file(self) -> str | None:
        """The file a ``resolve`` request names, else None."""
        match = re.fullmatch(r"/[^/]+/[^/]+/resolve/[^/]+/(.+)", self.path)
        return urllib.parse.unquote(match.group(1)) if match else None


@attrs.define
class StandInHub:
    """Serves each folder of ``repos`` (hub id -> folder) as a model repository at one commit, on 127.0.0.1."""

    repos: dict[str, Path]
    requests: list[Request] = attrs.field(factory=list)
    refuse: set[str] = attrs.field(factory=set)
    cut_once: dict[str, int] = attrs.field(factory=dict)
    url: str = ""
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def commit(self, repo_id: str) -> str:
        """The 40-hex commit ``main`` resolves to for ``repo_id``."""
        names = sorted(path.name for path in self.repos[repo_id].iterdir())
        return hashlib.sha1(f"{repo_id}\0{names}".encode()).hexdigest()

    def files(self, repo_id: str) -> list[Path]:
        return sorted(path for path in self.repos[repo_id].iterdir() if path.is_file())

    def fetched(self, method: str = "GET") -> list[str]:
        """The files requested with ``method``, in order."""
        with self._lock:
            return [r.file for r in self.requests if r.method == method and r.file is not None]

    def wait_for_the_others(self, repo_id: str, timeout_s: float = 30.0) -> None:
        """Until every file of ``repo_id`` that ``pull`` downloads, other than the refused ones, has been asked for
        (at most ``timeout_s``)."""
        from diffgemma_engine.loading.hub import LOAD_PATTERNS

        wanted = {
            file.name
            for file in self.repos[repo_id].iterdir()
            if file.name not in self.refuse and any(fnmatch.fnmatch(file.name, p) for p in LOAD_PATTERNS)
        }
        deadline = time.monotonic() + timeout_s
        while not wanted <= set(self.fetched("GET")) and time.monotonic() < deadline:
            time.sleep(0.05)

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: StandInHub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # nothing on stderr

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _json(self, data: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _error(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
            self._json({"error": code}, status, {"X-Error-Code": code, **(headers or {})})

        def _answer(self, body: bool) -> None:
            parts = urllib.parse.urlsplit(self.path)
            path = parts.path
            hub.record(Request(self.command, path, self.headers.get("Range")))
            if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", path):
                repo_id, kind, revision = match.group(1), match.group(2), urllib.parse.unquote(match.group(3))
                if repo_id not in hub.repos:
                    return self._error(404, "RepoNotFound")
                commit = hub.commit(repo_id)
                if revision not in ("main", commit):
                    return self._error(404, "RevisionNotFound")
                if kind == "revision":
                    siblings = [{"rfilename": file.name} for file in hub.files(repo_id)]
                    return self._json({"id": repo_id, "modelId": repo_id, "sha": commit, "siblings": siblings})
                entries = []
                for file in hub.files(repo_id):
                    entry: dict[str, object] = {
                        "type": "file",
                        "path": file.name,
                        "size": file.stat().st_size,
                        "oid": _git_blob_id(file),
                    }
                    if file.name.endswith(LFS_SUFFIXES):
                        entry["lfs"] = {"oid": _sha256(file), "size": file.stat().st_size, "pointerSize": 134}
                    entries.append(entry)
                return self._json(entries)
            if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                repo_id, revision, name = match.group(1), urllib.parse.unquote(match.group(2)), match.group(3)
                return self._file(repo_id, revision, urllib.parse.unquote(name), body)
            return self._error(404, "NotFound")

        def _file(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound")
            commit = hub.commit(repo_id)
            if revision not in ("main", commit):
                return self._error(404, "RevisionNotFound")
            file = hub.repos[repo_id] / name
            if "/" in name or not file.is_file():
                return self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
            if body and name in hub.refuse:
                hub.wait_for_the_others(repo_id)
                return self._error(403, "Forbidden")
            data = file.read_bytes()
            lfs = name.endswith(LFS_SUFFIXES)
            etag = _sha256(file) if lfs else _git_blob_id(file)
            start = 0
            if body and (wanted := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")):
                start = int(wanted.group(1))
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{etag}"')
            if lfs:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            with hub._lock:
                cut = hub.cut_once.pop(name, None)
            if cut is not None:  # half the body, then the connection drops, as a flaky network would
                self.wfile.write(data[start : start + cut])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler


@contextmanager
def serve_hub(repos: dict[str, Path]) -> Iterator[StandInHub]:
    """A running :class:`StandInHub` for ``repos``, stopped on exit."""
    hub = StandInHub(repos=repos)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="stand-in-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
