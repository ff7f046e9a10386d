"""Whether a checkpoint folder holds every weight file it names, whole: checked from the files' safetensors headers
before anything reads a weight, so that an interrupted download or a half-copied folder is refused in
milliseconds, naming what is missing, rather than deep in the load.

A safetensors file is an 8-byte little-endian header length, that many bytes of JSON (each tensor's
``data_offsets`` into the data that follows), then the data: its full size is known from the header alone.
Pure: the standard library only."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from ..errors import ModelLoadError
from .checkpoint_files import MAX_INDEX_FILE_BYTES, read_json_object

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100 << 20
"""safetensors' own limit on a header (the release's shards have headers of a few tens of KB)."""


def weight_files(folder: Path) -> tuple[str, ...]:
    """The weight files the folder's index names (``ModelLoadError`` for an index that is not one, or that names a
    file outside the folder), else ``model.safetensors`` when it is there, else none."""
    index = folder / INDEX_FILE
    if not index.is_file():
        return (SINGLE_FILE,) if (folder / SINGLE_FILE).is_file() else ()
    weight_map = read_json_object(index, MAX_INDEX_FILE_BYTES).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise ModelLoadError(f"{index} has no weight_map of tensor names to file names")
    names = sorted(set(weight_map.values()))
    for name in names:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not name:
            raise ModelLoadError(f"{index} names {name!r}, a file outside the checkpoint folder")
    return tuple(names)


def expected_size(path: Path) -> int:
    """The size the safetensors file at ``path`` has when whole, from its header (``ValueError`` when the header
    is not a safetensors header)."""
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER_BYTES:  # the length is the file's first bytes: never quoted
            raise ValueError(f"its header claims more than the {MAX_HEADER_BYTES} bytes safetensors allows")
        raw = handle.read(length)
    if len(raw) < length:
        raise ValueError("cut short inside its header")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"its header is not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("its header is nested too deep to be a safetensors header") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(x, int) for x in offsets):
            raise ValueError(f"its header gives {name!r} no data_offsets")
        end = max(end, offsets[1])
    return 8 + length + end


MAX_NAMED = 10
"""Problems named in one message at most (the rest counted)."""


def _size(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB" if count >= 1 << 20 else f"{count} bytes"


def problems(folder: Path) -> list[str]:
    """What is missing or cut short among the weight files the folder names, one line each (empty: all whole)."""
    found = []
    inside = folder.resolve()
    for name in weight_files(folder):
        path = folder / name
        if not path.parent.resolve().is_relative_to(inside):  # a linked folder (a file may be a link: the hub's are)
            found.append(f"{name} is in a folder linked outside the checkpoint folder")
            continue
        if not path.is_file():
            found.append(f"{name} is missing")
            continue
        try:
            whole = expected_size(path)
        except ValueError as exc:
            found.append(f"{name} is not a whole safetensors file: {exc}")
            continue
        size = path.stat().st_size
        if size != whole:
            found.append(f"{name} is {_size(size)} of {_size(whole)}" + (" (cut short)" if size < whole else ""))
    return found


def check_complete(folder: Path, fix: str = "") -> None:
    """``ModelLoadError`` naming each missing or cut-short weight file, or saying there are none; ``fix`` is what
    to do about it (for a hub id: the ``pull`` command)."""
    if not weight_files(folder):
        raise ModelLoadError(
            f"no weights in {folder}: it needs {SINGLE_FILE}, or {INDEX_FILE} and the shards it names"
            + (f"; {fix}" if fix else "")
        )
    if found := problems(folder):
        named = found[:MAX_NAMED] + ([f"and {len(found) - MAX_NAMED} more"] if len(found) > MAX_NAMED else [])
        raise ModelLoadError(
            f"the checkpoint in {folder} is incomplete: {'; '.join(named)}"
            + (f"; {fix}" if fix else " (copy or download the missing files)")
        )
