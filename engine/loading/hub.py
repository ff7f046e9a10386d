"""Where ``--model`` points: a local checkpoint folder, or a hub id (``google/diffusiongemma-26B-A4B-it``) resolved
to its snapshot folder in huggingface_hub's cache (``HF_HOME``, ``HF_HUB_CACHE``); ``diffgemma-engine pull``
downloads one there, only the files loading needs.

Loads are offline-safe: the engine sets ``HF_HUB_OFFLINE=1`` for itself unless the user set it, and a hub id is
then looked up in the cache alone (a clear error naming ``pull`` when it is not there). Before anything reads a
weight, the folder is checked whole (``diffgemma_engine.loading.shards``). huggingface_hub is imported only when a hub
id is used."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import attrs

from ..errors import ModelLoadError
from ..shared.socket_paths import is_hub_id
from . import shards
from .checkpoint_files import DEFAULT_MODEL_DIR, HINTS_FILE

LOAD_PATTERNS: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    HINTS_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    shards.INDEX_FILE,
    "model*.safetensors",
)
"""What ``pull`` downloads (huggingface_hub's ``allow_patterns``): what ``diffgemma_engine.loading.model.load_model``
reads. Not the processor's, the README's or other formats' files."""


def offline() -> bool:
    """Whether downloads are off: ``HF_HUB_OFFLINE`` as the environment holds it now (huggingface_hub reads it
    once, when imported; the engine sets it later for itself)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _pull_hint(repo_id: str) -> str:
    return f"download it first with `diffgemma-engine pull {repo_id}`"


def _retry_hint() -> str:
    """Why ``pull`` could not download, and what to do (not: run ``pull``)."""
    if offline():
        return "downloads are off (HF_HUB_OFFLINE is set): unset it to pull"
    return (
        f"the hub ({_endpoint()}) cannot be reached: check the network (or HF_ENDPOINT) and run this again; "
        "what was downloaded is kept"
    )


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


@functools.cache
def hub_reachable() -> bool:
    """Whether the hub answers at all (any HTTP status), asked once per process with huggingface_hub's own session
    and metadata timeout (``HF_HUB_ETAG_TIMEOUT``): unreachable, a download is not tried, so that huggingface_hub
    does not spend half a minute in retries (its five, with backoff, on a file not cached) to say the same. Its
    library logger stops passing records to the root logger here, so that a warning it prints (a retry on a flaky
    network) is printed once, not again by the engine's own handler."""
    import httpx2
    from huggingface_hub import constants, get_session
    from huggingface_hub.utils import logging

    logging.disable_propagation()
    try:
        get_session().head(constants.ENDPOINT, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except (httpx2.TransportError, OSError):
        return False
    return True


def _local_only(download: bool) -> bool:
    """Whether to look in the cache alone: downloads off, not asked for, or the hub out of reach."""
    return offline() or not download or not hub_reachable()


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hub_error(repo_id: str, exc: Exception, *, pulling: bool = False) -> ModelLoadError:
    """A huggingface_hub failure for ``repo_id`` as the engine reports it (``pulling``: to ``pull`` itself, which
    is not told to run ``pull``)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hint = _retry_hint() if pulling else _pull_hint(repo_id)
    if isinstance(exc, IncompleteSnapshotError):
        return ModelLoadError(f"the cached snapshot of {repo_id} is incomplete ({exc}): {hint}")
    if isinstance(exc, LocalEntryNotFoundError):
        why = "downloads are off (HF_HUB_OFFLINE=1)" if offline() else f"the hub ({_endpoint()}) cannot be reached"
        if pulling:
            return ModelLoadError(f"cannot download {repo_id}: {hint}")
        return ModelLoadError(f"{repo_id} is not a folder here, nor in the hub cache {_cache_dir()}, and {why}: {hint}")
    if isinstance(exc, GatedRepoError):
        return ModelLoadError(f"{repo_id} is gated on the hub: accept its terms there, then `hf auth login`")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelLoadError(f"no model {repo_id} on the hub (nor a folder of that name here)")
    if isinstance(exc, RevisionNotFoundError):
        return ModelLoadError(f"{repo_id} has no such revision on the hub: {exc}")
    return ModelLoadError(f"cannot fetch {repo_id} from the hub: {type(exc).__name__}: {exc}")


def _hub_failures() -> tuple[type[Exception], ...]:
    import httpx2

    return (OSError, ValueError, httpx2.HTTPError)


def snapshot(repo_id: str, revision: str | None = None, *, download: bool | None = None) -> Path:
    """The snapshot folder of ``repo_id`` in the hub cache with the files loading needs, downloaded when missing
    and ``download`` (default: unless ``HF_HUB_OFFLINE`` is set); resumable as huggingface_hub is."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=list(LOAD_PATTERNS),
            local_files_only=_local_only(not offline() if download is None else download),
        )
    except _hub_failures() as exc:
        raise hub_error(repo_id, exc, pulling=bool(download)) from exc
    return Path(folder)


def config_folder(repo_id: str, revision: str | None = None) -> Path:
    """The snapshot folder holding ``repo_id``'s ``config.json``, fetching that one file if needed (the plan's
    input: what fits is known before the weights move)."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=_local_only(True))
    except _hub_failures() as exc:
        raise hub_error(repo_id, exc) from exc
    return Path(path).parent


def model_folder(model: str | Path | None) -> Path:
    """The local folder ``model`` names: the shipped model for None, a folder as given, a hub id's cached
    snapshot (downloaded only when ``HF_HUB_OFFLINE`` is off). Nothing is checked in it."""
    if model is None:
        return DEFAULT_MODEL_DIR
    text = str(model)
    if is_hub_id(text):
        return snapshot(text)
    return Path(os.path.expanduser(text))


def checkpoint_folder(model: str | Path | None) -> Path:
    """:func:`model_folder`, checked to hold a config and every weight file whole, before anything reads one."""
    folder = model_folder(model)
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"no DiffusionGemma checkpoint in {folder}: config.json is missing")
    shards.check_complete(folder, _pull_hint(str(model)) if model is not None and is_hub_id(str(model)) else "")
    return folder


def pull(repo_id: str, revision: str | None = None) -> Path:
    """``diffgemma-engine pull``: download what loading ``repo_id`` needs into the hub cache (huggingface_hub's
    progress bars on stderr; what is already there is kept), then check it whole. Returns the snapshot folder."""
    if not is_hub_id(repo_id):
        raise ModelLoadError(f"{repo_id!r} is not a hub id (owner/name, e.g. google/diffusiongemma-26B-A4B-it)")
    folder = snapshot(repo_id, revision, download=True)
    shards.check_complete(folder, f"run `diffgemma-engine pull {repo_id}` again")
    return folder


@attrs.frozen(kw_only=True)
class CacheState:
    """How much of a hub id's checkpoint is in the hub cache (its ``main`` snapshot): what ``doctor`` shows while
    or after ``pull`` runs."""

    repo_id: str
    folder: Path | None
    """The snapshot folder, once its ``config.json`` is there."""
    weight_files: int
    """Weight files the snapshot's index names (0 before the index is downloaded)."""
    problems: tuple[str, ...]

    @property
    def whole(self) -> bool:
        return self.folder is not None and self.weight_files > 0 and not self.problems

    def summary(self) -> str:
        if self.folder is None:
            return f"{self.repo_id} is not in the hub cache {_cache_dir()}: {_pull_hint(self.repo_id)}"
        if self.whole:
            return f"{self.repo_id}: every weight file whole in {self.folder}"
        done = self.weight_files - len(self.problems) if self.weight_files else 0
        return (
            f"{self.repo_id}: {done} of {self.weight_files or '?'} weight files whole in {self.folder} "
            f"({'; '.join(self.problems)}): `diffgemma-engine pull {self.repo_id}` fetches the rest"
        )


def cache_state(repo_id: str) -> CacheState:
    """Which of ``repo_id``'s weight files the hub cache holds whole, from the cache alone (no network)."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        return CacheState(repo_id=repo_id, folder=None, weight_files=0, problems=())
    return snapshot_state(repo_id, Path(config).parent)


def snapshot_state(repo_id: str, folder: Path) -> CacheState:
    """Which weight files the snapshot ``folder`` of ``repo_id`` holds whole."""
    try:
        names = shards.weight_files(folder)
        problems = tuple(shards.problems(folder)) if names else ("the weights are not downloaded",)
    except ModelLoadError as exc:
        names, problems = (), (str(exc),)
    return CacheState(repo_id=repo_id, folder=folder, weight_files=len(names), problems=problems)
