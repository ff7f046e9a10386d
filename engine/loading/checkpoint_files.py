"""A checkpoint folder's small JSON files (``config.json``, ``generation_config.json``, ``diffgemma.json``, the
safetensors index), each read with a size limit and checked to hold an object; the dtype the weights are stored
in; and two fields of a built config that transformers types loosely, narrowed once. Pure: no torch, and
transformers only for the type checker, so the memory plan, the loader and the canvas maths share it without
importing each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import DiffusionGemmaConfig

DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "default_model"  # the real folder, not an editable link tree
MAX_SETTINGS_FILE_BYTES = 1 << 20
"""config.json, generation_config.json and diffgemma.json larger than this are refused before they are read."""
MAX_INDEX_FILE_BYTES = 64 << 20
"""A safetensors index larger than this is refused (the release's is a few hundred KB)."""
HINTS_FILE = "diffgemma.json"
"""Optional serving hints in a checkpoint folder: ``max_prompt_tokens`` (e.g. 384 for a model trained on short
prompts), ``line_canvas_length`` (the canvas for requests whose scope is the rest of a line), ``min_steps`` (the
fewest of its schedule's steps a deadline leaves a completion: ``diffgemma_engine.canvas.clock``) and, for a chat
checkpoint, ``chat_order`` (``suffix_first`` or ``in_place``: see ``diffgemma_engine.shared.prompt``)."""
SETTINGS_FILES = ("config.json", "generation_config.json", HINTS_FILE)


def check_size(path: Path, limit: int = MAX_SETTINGS_FILE_BYTES) -> None:
    """``ModelLoadError`` when the file at ``path`` (if any) is over ``limit`` bytes, or is not a regular file (a
    device or a pipe reads forever), before anything reads it."""
    if path.is_file():
        if (size := path.stat().st_size) > limit:
            raise ModelLoadError(
                f"{path} is {size} bytes: a checkpoint's {path.name} holds at most {limit} (the release's files are "
                "several times smaller)"
            )
    elif path.exists():
        raise ModelLoadError(f"{path} is not a regular file: a checkpoint's files are read whole")


def read_json_object(path: Path, limit: int = MAX_SETTINGS_FILE_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``, or ``ModelLoadError`` saying why not (too large, not JSON, not an object)."""
    check_size(path, limit)
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data


def stored_dtype(config: dict[str, Any]) -> str | None:
    """The dtype ``config.json`` says the weights are stored in (``dtype``, formerly ``torch_dtype``, at the top
    or in its ``text_config``)."""
    dtype = config.get("dtype") or config.get("torch_dtype")
    text = config.get("text_config")
    if dtype is None and isinstance(text, dict):
        dtype = text.get("dtype") or text.get("torch_dtype")
    return str(dtype) if dtype is not None else None


def canvas_length_of(config: DiffusionGemmaConfig) -> int:
    """The checkpoint's ``canvas_length`` (``ModelLoadError`` when its config sets none)."""
    if config.canvas_length is None:
        raise ModelLoadError("the checkpoint's config.json sets no canvas_length")
    return int(config.canvas_length)
