"""What a model folder may hold before anything reads it: every file the engine or transformers reads is refused
when over its size (or not a regular file), and ``config.json``'s sizes (layers, widths, experts, vocabulary,
heads) are bounded before a model is built from them, even on the meta device. ``check_folder`` is called first
by every entry point that reads a folder (``diffgemma_engine.loading.model.load_model``,
``diffgemma_engine.loading.plan.read_spec``), so a hostile or broken folder is refused in milliseconds, naming the file
or the key, instead of a load or a ``plan`` that runs for minutes or takes gigabytes. Pure: the standard library and
``diffgemma_engine.loading.checkpoint_files`` only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..shared.protocol import MAX_CANVAS_LENGTH
from .checkpoint_files import HINTS_FILE, MAX_INDEX_FILE_BYTES, MAX_SETTINGS_FILE_BYTES, check_size, read_json_object

MIB = 1 << 20
FILE_CAPS: dict[str, int] = {
    "config.json": MAX_SETTINGS_FILE_BYTES,
    "generation_config.json": MAX_SETTINGS_FILE_BYTES,
    HINTS_FILE: MAX_SETTINGS_FILE_BYTES,
    "model.safetensors.index.json": MAX_INDEX_FILE_BYTES,
    "tokenizer.json": 256 * MIB,
    "tokenizer.model": 64 * MIB,
    "vocab.json": 64 * MIB,
    "merges.txt": 64 * MIB,
    "tokenizer_config.json": 32 * MIB,
    "special_tokens_map.json": 4 * MIB,
    "added_tokens.json": 32 * MIB,
    "chat_template.jinja": 1 * MIB,
    "chat_template.json": 1 * MIB,
    "processor_config.json": 4 * MIB,
    "preprocessor_config.json": 4 * MIB,
}
"""The most bytes of each file transformers or the engine reads from a model folder. The release's largest is
``tokenizer.json`` (about 30 MB, Gemma's 262,144-token vocabulary); its ``tokenizer_config.json`` is about 1 MB,
its chat template about 10 KB, its ``config.json`` 3 KB: every cap leaves several times that."""
CHAT_TEMPLATES_DIR = "additional_chat_templates"
"""transformers reads every ``*.jinja`` here as a named chat template (capped as ``chat_template.jinja``)."""
MAX_CHAT_TEMPLATES = 64
OTHER_FILE_CAP = 32 * MIB
"""Any other ``.json``, ``.jinja``, ``.txt`` or ``.model`` file at the folder's top (transformers' readers vary by
tokenizer class): weights (``.safetensors``) and documents are not read as a whole and are not capped."""
READ_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")

TEXT_BOUNDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 512),
    "hidden_size": (1, 65_536),
    "intermediate_size": (1, 262_144),
    "moe_intermediate_size": (1, 262_144),
    "num_experts": (1, 4_096),
    "top_k_experts": (1, 256),
    "vocab_size": (1, 1 << 22),
    "num_attention_heads": (1, 1_024),
    "num_key_value_heads": (1, 1_024),
    "head_dim": (1, 8_192),
    "global_head_dim": (1, 8_192),
    "max_position_embeddings": (1, 1 << 24),
    "sliding_window": (1, 1 << 24),
    "hidden_size_per_layer_input": (0, 65_536),
    "vocab_size_per_layer_input": (0, 1 << 22),
}
"""Bounds (lowest, highest) of ``text_config``'s sizes, the highest far above the release's (30 layers, hidden
size 2,816, 128 experts, top 8, a 262,144-token vocabulary, 16 heads, head size 512, 262,144 positions): a model
past them is not a DiffusionGemma this engine can serve, and building it even on the meta device takes minutes and
gigabytes (20,000 layers: over 75 s and 2.3 GB); a zero width divides by zero while it is built."""
VISION_BOUNDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 512),
    "hidden_size": (1, 65_536),
    "intermediate_size": (1, 262_144),
    "num_attention_heads": (1, 1_024),
    "num_key_value_heads": (1, 1_024),
    "head_dim": (1, 8_192),
    "max_position_embeddings": (1, 1 << 24),
    "position_embedding_size": (1, 1 << 20),
    "patch_size": (1, 1_024),
    "pooling_kernel_size": (1, 1_024),
    "default_output_length": (0, 1 << 20),
}
"""The same for ``vision_config`` (the release's: 27 layers, hidden size 1,152, 10,240 position embeddings)."""
TOP_BOUNDS: dict[str, tuple[int, int]] = {"canvas_length": (1, MAX_CANVAS_LENGTH)}
MAX_LAYER_ENTRIES = TEXT_BOUNDS["num_hidden_layers"][1]
"""``layer_types`` and ``per_layer_config`` hold at most this many entries (one per layer)."""


def check_files(folder: Path) -> None:
    """Every file of ``folder`` that is read whole, checked against its cap (``FILE_CAPS``, ``OTHER_FILE_CAP``)."""
    for name, limit in FILE_CAPS.items():
        check_size(folder / name, limit)
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        if path.name not in FILE_CAPS and path.suffix in READ_SUFFIXES:
            check_size(path, OTHER_FILE_CAP)
    templates = folder / CHAT_TEMPLATES_DIR
    if templates.is_dir():
        found = sorted(templates.iterdir())
        if len(found) > MAX_CHAT_TEMPLATES:
            raise ModelLoadError(f"{templates} holds {len(found)} files: at most {MAX_CHAT_TEMPLATES} chat templates")
        for path in found:
            check_size(path, FILE_CAPS["chat_template.jinja"])


def _check_sizes(where: str, section: object, bounds: dict[str, tuple[int, int]]) -> None:
    """Each of ``bounds``' keys in ``section`` (if it is an object) a whole number within its (low, high)."""
    if section is None:
        return
    if not isinstance(section, dict):
        raise ModelLoadError(f"{where.rstrip(': .')} must be an object, got {type(section).__name__}")
    for key, (low, high) in bounds.items():
        value = section.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ModelLoadError(f"{where}{key} must be a whole number from {low} to {high}, got {value!r}")


def check_config(config: dict[str, Any], where: str = "config.json") -> None:
    """``config.json``'s sizes within the bounds above, naming the key that is not (before anything is built)."""
    _check_sizes(f"{where}: ", config, TOP_BOUNDS)
    text = config.get("text_config")
    _check_sizes(f"{where}: text_config.", text, TEXT_BOUNDS)
    _check_sizes(f"{where}: vision_config.", config.get("vision_config"), VISION_BOUNDS)
    if isinstance(text, dict):
        for key in ("layer_types", "per_layer_config"):
            entries = text.get(key)
            if isinstance(entries, list | dict) and len(entries) > MAX_LAYER_ENTRIES:
                raise ModelLoadError(
                    f"{where}: text_config.{key} has {len(entries)} entries, more than {MAX_LAYER_ENTRIES} layers"
                )
        experts, top_k = text.get("num_experts"), text.get("top_k_experts")
        if isinstance(experts, int) and isinstance(top_k, int) and top_k > experts:
            raise ModelLoadError(f"{where}: text_config.top_k_experts ({top_k}) is more than num_experts ({experts})")
        per_layer = text.get("per_layer_config")
        if per_layer is not None and not isinstance(per_layer, dict):
            raise ModelLoadError(
                f"{where}: text_config.per_layer_config must be an object, got {type(per_layer).__name__}"
            )
        if isinstance(per_layer, dict):
            for index, layer in per_layer.items():
                _check_sizes(f"{where}: text_config.per_layer_config[{index!r}].", layer, TEXT_BOUNDS)


def check_folder(folder: Path) -> dict[str, Any]:
    """The folder's files within their caps and its config's sizes within bounds; returns ``config.json``'s object
    (``ModelLoadError`` naming the file or key otherwise)."""
    check_files(folder)
    config = read_json_object(folder / "config.json")
    check_config(config)
    return config
