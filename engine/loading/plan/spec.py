"""A checkpoint built on the meta device and described as :class:`Weight` records: the plan's input."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...canvas.runtime import text_config_of
from ...errors import ModelLoadError, describe
from .. import shards
from ..checkpoint_files import (
    DEFAULT_MODEL_DIR,
    MAX_INDEX_FILE_BYTES,
    canvas_length_of,
    read_json_object,
    stored_dtype,
)
from ..folder_limits import check_folder
from .memory import kind_of
from .records import (
    AttentionLayer,
    ModelSpec,
    StoredCheckpoint,
    Weight,
)

if TYPE_CHECKING:
    import torch
    from transformers import DiffusionGemmaConfig


def stored_checkpoint(folder: Path, config: dict[str, Any]) -> StoredCheckpoint:
    """The stored dtype (``config.json``) and size: the index's ``total_size``, else the safetensors files' data
    (their size less their header; no tensor is read)."""
    dtype = stored_dtype(config)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        metadata = read_json_object(index, MAX_INDEX_FILE_BYTES).get("metadata", {})
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            raise ModelLoadError(f"{index}: metadata.total_size must be a whole number of bytes, got {total!r}")
        return StoredCheckpoint(
            dtype=dtype, bytes=total or None, source=index.name, missing=tuple(shards.problems(folder))
        )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return StoredCheckpoint(dtype=dtype, bytes=None, source=None)
    data = 0
    for path in files:
        with path.open("rb") as handle:
            header = int.from_bytes(handle.read(8), "little")
        data += path.stat().st_size - 8 - header
    return StoredCheckpoint(dtype=dtype, bytes=data, source=", ".join(path.name for path in files))


def describe_model(model: torch.nn.Module) -> tuple[list[Weight], int, list[tuple[str, str]]]:
    """The :class:`Weight` records of a built model (meta or not), its parameter count before tying, and the
    (module, unit) pairs a device map needs: every no-split block, every other module holding a tensor (none inside
    another), under each of its names.

    Each tensor is recorded once, under its first name; its unit is the outermost ``_no_split_modules`` block that
    holds it (else its own module), merged with every other unit that holds the same tensor.
    """
    import torch

    no_split = set(getattr(model, "_no_split_modules", None) or ())
    modules = list(model.named_modules(remove_duplicate=False))
    classes = {name: type(module).__name__ for name, module in modules}
    roots: dict[str, str] = {}

    def root(unit: str) -> str:
        while roots.setdefault(unit, unit) != unit:
            unit = roots[unit]
        return unit

    first: dict[int, tuple[str, tuple[int, ...], str, bool, bool, str]] = {}
    holders: dict[str, str] = {}
    before_tie = 0
    for module_name, module in modules:
        unit = _unit_of(module_name, classes, no_split)
        root(unit)
        tensors = [(leaf, tensor, False) for leaf, tensor in module.named_parameters(recurse=False)]
        tensors += [(leaf, tensor, True) for leaf, tensor in module.named_buffers(recurse=False)]
        if any(tensor is not None for _, tensor, _ in tensors):  # a no-split block, or the module holding it
            holders[unit] = unit
        for leaf, tensor, is_buffer in tensors:
            if tensor is None:
                continue
            if not is_buffer:
                before_tie += tensor.numel()
            tensor_id = id(tensor)
            if tensor_id in first:
                a, b = root(first[tensor_id][5]), root(unit)
                if a != b:  # the earlier unit names the merged one
                    roots[b] = a
                continue
            name = f"{module_name}.{leaf}" if module_name else leaf
            kind = kind_of(
                name, linear=isinstance(module, torch.nn.Linear), embedding=isinstance(module, torch.nn.Embedding)
            )
            first[tensor_id] = (name, tuple(tensor.shape), kind, is_buffer, isinstance(module, torch.nn.Linear), unit)
    for ancestor, nested in _nested_holders(holders):
        a, b = root(ancestor), root(nested)
        if a != b:
            roots[b] = a
    weights = [
        Weight(name=name, shape=shape, kind=kind, unit=root(unit), buffer=is_buffer, linear=linear)
        for name, shape, kind, is_buffer, linear, unit in first.values()
    ]
    return weights, before_tie, [(key, root(unit)) for key, unit in holders.items()]


def _unit_of(module_name: str, classes: dict[str, str], no_split: set[str]) -> str:
    """The outermost no-split ancestor of ``module_name`` (``classes``: each module's class name), else the module
    itself."""
    parts = module_name.split(".") if module_name else []
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if classes.get(prefix) in no_split:
            return prefix
    return module_name


def _nested_holders(holders: dict[str, str]) -> list[tuple[str, str]]:
    """The (ancestor's unit, nested holder's unit) pairs to merge, each nested holder taken out of ``holders``.

    A device map cannot send a module one way and one of its submodules another (accelerate places a mapped module
    whole): a module that holds tensors itself and contains other holders (the vision tower's scale and bias) makes
    one unit with them, and only it is a key."""
    merged = []
    keys = sorted(holders)
    for index, key in enumerate(keys):
        for ancestor in keys[:index]:
            if key.startswith(ancestor + ".") and ancestor in holders:
                merged.append((holders[ancestor], holders.pop(key)))
                break
    return merged


def attention_layers(config: DiffusionGemmaConfig) -> tuple[AttentionLayer, ...]:
    """What each text layer of a DiffusionGemma config caches per token (Gemma 4's layers may differ in width)."""
    text = text_config_of(config)
    assert text.layer_types is not None  # DiffusionGemmaTextConfig.__post_init__ fills it in
    return tuple(
        AttentionLayer(
            kv_width=layer.num_key_value_heads * layer.head_dim,
            window=text.sliding_window if layer_type == "sliding_attention" else None,
        )
        for layer, layer_type in (
            (text.per_layer_config[index] if getattr(text, "is_heterogeneous", False) else text, layer_type)
            for index, layer_type in enumerate(text.layer_types[: text.num_hidden_layers])
        )
    )


def read_spec(model_dir: Path | None) -> ModelSpec:
    """Build the checkpoint in ``model_dir`` (the shipped model when None) on the meta device and describe it.

    Reads ``config.json`` (and the safetensors index or headers for the stored size); loads no weights.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if model_dir is None:
        model_dir = DEFAULT_MODEL_DIR
        name = "default"
    else:
        name = str(Path(model_dir).resolve())
    folder = Path(model_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():  # before torch is imported: a mistyped folder is reported at once
        raise ModelLoadError(f"no DiffusionGemma checkpoint in {folder}: {config_path} is missing")

    import torch
    from transformers import AutoConfig, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)  # set_verbosity_error(), which transformers leaves unannotated
    raw = check_folder(folder)  # files capped and sizes bounded, before transformers reads or builds anything
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # whatever transformers raises on it, the folder's config is at fault
        raise ModelLoadError(f"cannot read {config_path}: {describe(exc)}") from exc
    if not isinstance(config, DiffusionGemmaConfig):
        raise ModelLoadError(f"{config_path} describes a {config.model_type!r} model, not DiffusionGemma")
    start = time.perf_counter()
    try:
        with torch.device("meta"):
            model = DiffusionGemmaForBlockDiffusion(config)
    except Exception as exc:  # the sizes are bounded, so any failure here is the config's
        raise ModelLoadError(f"cannot build the model {config_path} describes: {describe(exc)}") from exc
    model.tie_weights()
    build_s = time.perf_counter() - start
    weights, before_tie, members = describe_model(model)
    # named_parameters lists a tied tensor once (data_ptr cannot tell meta tensors apart); describe_model goes by
    # the tensor objects of every name: the two counts agree when every tie is seen.
    unique = sum(parameter.numel() for _, parameter in model.named_parameters())
    if unique != sum(weight.numel for weight in weights if not weight.buffer):
        raise RuntimeError(f"named_parameters counts {unique} parameters, the tensors of every name another number")
    if config.tie_word_embeddings and unique == before_tie:
        raise RuntimeError("config.json ties the encoder to the decoder, but the model built has no shared tensor")
    text = text_config_of(config)
    attention = attention_layers(config)
    return ModelSpec(
        folder=name,
        architecture=type(model).__name__,
        weights=tuple(weights),
        parameters_before_tie=before_tie,
        attention=attention,
        canvas_length=canvas_length_of(config),
        vocab_size=int(text.vocab_size),
        stored=stored_checkpoint(folder, raw),
        build_s=build_s,
        members=tuple(members),
    )
