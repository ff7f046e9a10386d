"""Quantized loading: the ``from_pretrained`` arguments of each method and the fix-ups after it (the check that the
load really quantized is ``diffgemma_engine.loading.quantize_check``).

What this model needs that a quantizer's defaults do not give (measured with transformers 5.24, torchao 0.18.0 and
torch 2.13.0+cpu on the release-format checkpoints of ``tests/support/release_format.py``):

* **the skip list.** Left to its defaults a transformers quantizer skips every tied key, and in DiffusionGemma every
  encoder weight is tied to the decoder's: nothing in the text stack is converted. Its matcher takes a pattern as a
  prefix, a regex from the start or a suffix of the full name, so the names of
  ``diffgemma_engine.loading.quantize_policy`` become anchored regexes (:func:`skip_patterns`), norms included.
* **the routed experts** (88% of the weights) are fused 3-D ``nn.Parameter``\\ s, not ``nn.Linear`` layers: torchao
  reaches them through an ``FqnToConfig`` entry for the parameter names, beside one for the ``nn.Linear`` weights.
* **int8** (``Int8WeightOnlyConfig``, symmetric, one scale per output row) holds its weights in torchao's
  ``Int8Tensor``, which implements ``select`` and ``linear`` but neither ``transpose`` (the default ``grouped_mm``
  experts) nor ``bmm`` (``batched_mm``): the experts run ``experts_implementation="eager"``, and that path fails under
  ``torch.inference_mode`` (``Cannot set version_counter for inference tensor``, from ``Int8Tensor``'s ``select`` of
  one expert) but runs under ``torch.no_grad``: see ``grad_mode_for``. Quantized at ``from_pretrained``, each
  tensor is converted once as it is read and then tied, so encoder and decoder keep one copy; quantizing after the
  load would convert the encoder's and the decoder's names separately. torchao's C++ extensions in the 0.18.0 wheel
  are CUDA builds (``_C_cutlass_90a``, ``_C_mxfp8`` need ``libtorch_cuda``) and do not load with a CPU torch; the
  int8 path uses none of them. torchao is an optional dependency (``pip install "torchao==0.18.0"``) and pulls no
  other package.
* **int4** is not available on this stack (:data:`INT4_UNAVAILABLE`).
* **fp8** (transformers' ``FineGrainedFP8Config``: float8 weights with a float32 scale per block, CUDA compute
  capability 8.9+) swaps in its own expert and linear modules, and its load ties the encoder's weights to the
  decoder's but not their scales: the tie map is computed before the swap, so the encoder's ``*_scale_inv`` stay
  uninitialised memory. :func:`finish_load` ties them again from a map recomputed after the swap. Its block must
  divide every converted matrix (the release's expert ``down_proj`` reads 704 inputs: a 128 block would leave it
  unconverted, in a float8 tensor without a scale), so it is the largest of :data:`BLOCK_SIZES` that does. Built and
  tied on CPU here (the load path only); its forward pass needs CUDA and has not been run.

A checkpoint saved quantized (:func:`save_quantized`) says so in its ``config.json``; that choice is the checkpoint's
and an explicit conflicting one is refused (:func:`resolve_method`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import attrs

from ..errors import ModelLoadError
from ..shared.protocol import QUANTIZATION_CHOICES
from . import loadable
from .quantize_policy import EXPERT_WEIGHTS, UNQUANTIZED_MODULES, stays_unquantized

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    GradMode = type[torch.no_grad] | type[torch.inference_mode]

P = ParamSpec("P")
R = TypeVar("R")
ModelT = TypeVar("ModelT", bound="torch.nn.Module")

QUANTIZATIONS: tuple[str, ...] = (*QUANTIZATION_CHOICES, "int4")
"""The methods known here: those an engine loads, and int4, refused with the reason (:data:`INT4_UNAVAILABLE`)."""
TORCHAO_METHODS: tuple[str, ...] = ("int8", "int4")
TORCHAO_INSTALL = loadable.TORCHAO_INSTALL
BLOCK_SIZES: tuple[int, ...] = (128, 64, 32)
"""fp8 scale blocks, largest first: the first that divides both dimensions of every converted matrix is used."""
EXPERTS_IMPLEMENTATION = {"int8": "eager"}
"""The experts forward each method needs (``from_pretrained(..., experts_implementation=...)``); others keep the
default (``grouped_mm``)."""
SKIPPED_NORMS = r"(?:.*\.)?[^.]*norm[^.]*"
"""Any module whose name contains ``norm``, as ``stays_unquantized`` reads it."""
INT4_UNAVAILABLE = (
    "int4 is not available: torchao 0.18 has no int4 layout that holds and runs the routed experts' fused 3-D "
    "tensors (88% of the weights). Its packed Int4Tensor needs the CUDA-only mslk kernels (not on PyPI) and, by its "
    "source, implements neither select, index nor grouped_mm for the experts' forward; its plain_int32 and "
    "tile_packed_to_4d layouts are XPU/NPU and CUDA only; IntxWeightOnlyConfig refuses 3-D tensors (and stores int4 "
    "unpacked, a byte each); the CPU int4 layout (Int4OpaqueTensor) takes 2-D nn.Linear weights only. "
    "Use --quantization int8"
)


def skip_patterns() -> list[str]:
    """``modules_to_not_convert`` for a transformers quantizer: ``diffgemma_engine.loading.quantize_policy``'s modules
    and the norms.

    transformers (``quantizers_utils.should_convert_module``) matches a pattern from the start of a full name up to
    a module boundary, or as a suffix: a bare ``router`` would match neither ``model.decoder.layers.0.router.proj``
    nor its weight. Each name becomes a regex for one whole dotted component, anywhere.
    """
    return [rf"(?:.*\.)?{re.escape(module)}" for module in UNQUANTIZED_MODULES] + [SKIPPED_NORMS]


def converted(name: str) -> bool:
    """True for a tensor name the quantizers convert (the policy's, with a float8 scale counted as its weight's)."""
    return not stays_unquantized(name.removesuffix("_scale_inv"))


# -- which method, and its arguments -----------------------------------------------------------------------------


def checkpoint_method(config: dict[str, Any]) -> str | None:
    """The method a checkpoint was saved with (its ``config.json``'s ``quantization_config``), None for plain weights;
    ``ModelLoadError`` for a quantization the engine cannot check."""
    quantization = config.get("quantization_config")
    if not quantization:
        return None
    if not isinstance(quantization, dict):
        raise ModelLoadError(f"config.json: quantization_config must be an object, got {quantization!r}")
    method = quantization.get("quant_method")
    if method == "fp8":
        return "fp8"
    if method == "torchao":
        types = set(_config_types(quantization.get("quant_type")))
        if types and all(name.startswith("Int8WeightOnly") for name in types):
            return "int8"
        if any("Int4" in name for name in types):
            return "int4"
        raise ModelLoadError(
            f"config.json: torchao quantization {', '.join(sorted(types)) or quantization.get('quant_type')!r} is "
            "not one the engine serves (it serves int8 weight-only)"
        )
    raise ModelLoadError(
        f"config.json: the checkpoint is quantized with {method!r}; the engine serves plain checkpoints and its own "
        f"{', '.join(QUANTIZATION_CHOICES[1:])} quantizations"
    )


def _config_types(value: object) -> Iterator[str]:
    """The torchao config classes named in a serialized ``quant_type`` (an ``FqnToConfig``'s entries included)."""
    if isinstance(value, dict):
        kind = value.get("_type")
        if isinstance(kind, str) and kind.endswith("Config") and kind not in ("FqnToConfig", "ModuleFqnToConfig"):
            yield kind
        for key, item in value.items():
            if key != "_type":
                yield from _config_types(item)
    elif isinstance(value, str) and value.endswith("Config"):  # an older transformers' bare class name
        yield value


def resolve_method(requested: str | None, folder: Path) -> tuple[str, bool]:
    """(method, pre-quantized) for a load of ``folder``: the checkpoint's own quantization when it has one.

    ``requested`` None means no choice was made: the checkpoint's, else ``none``. A choice that differs from the
    checkpoint's quantization is refused, ``none`` included (its weights exist only quantized).
    """
    if requested is not None and requested not in QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization {requested!r}: use one of {', '.join(QUANTIZATIONS)}")
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    saved = checkpoint_method(config) if isinstance(config, dict) else None
    if saved is None:
        return requested or "none", False
    if requested not in (None, saved):
        raise ModelLoadError(
            f"the checkpoint in {folder} is saved quantized ({saved}, its config.json's quantization_config): it "
            f"cannot be loaded as {requested}; leave --quantization out or pass {saved}"
        )
    return saved, True


def device_names(devices: Sequence[str] | str | torch.device) -> tuple[str, ...]:
    """A device map's devices as names (``cuda:0``, ``mps``, ``cpu``, ``disk``), from a list of them, one
    ``torch.device`` or a ``--device``-style string (``cuda:0,cpu``)."""
    if not isinstance(devices, str) and not isinstance(devices, Sequence):
        devices = str(devices)
    items = devices.split(",") if isinstance(devices, str) else list(devices)
    names = [item.strip().lower() for item in items if item.strip()]
    return tuple("cuda:0" if name == "cuda" else name for name in names)


def from_pretrained_kwargs(
    method: str,
    devices: Sequence[str] | str | torch.device,
    folder: Path | None = None,
    *,
    pre_quantized: bool = False,
    env: loadable.Environment | None = None,
) -> dict[str, Any]:
    """The keyword arguments that make ``DiffusionGemmaForBlockDiffusion.from_pretrained`` load with ``method`` onto
    ``devices`` (the device map's devices); ``ModelLoadError`` saying why, and what to use instead, when the method
    cannot load there (``diffgemma_engine.loading.loadable.refusal`` in ``env``, this machine's by default), before any
    weight is read.

    Never the placement: ``device_map`` (and ``offload_folder``) are ``diffgemma_engine.loading.model.load_model``'s
    alone, whatever the method. ``pre_quantized``: the checkpoint holds the method's weights already
    (``resolve_method``); only the experts implementation is passed, the quantization is the checkpoint's. ``folder`` is
    needed for fp8 on the fly (its block size is chosen from the model's shapes).
    """
    if method not in QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization {method!r}: use one of {', '.join(QUANTIZATIONS)}")
    if method == "none":
        return {}
    if method == "int4":
        raise ModelLoadError(INT4_UNAVAILABLE)
    reason = loadable.refusal(method, device_names(devices), env if env is not None else loadable.environment())
    if reason is not None:
        raise ModelLoadError(reason)
    kwargs: dict[str, Any] = {}
    if method == "int8":
        kwargs["experts_implementation"] = EXPERTS_IMPLEMENTATION["int8"]
        if not pre_quantized:
            kwargs["quantization_config"] = int8_config()
        return kwargs
    if not pre_quantized:  # fp8
        if folder is None:
            raise ModelLoadError("fp8 quantization on the fly needs the checkpoint folder (for its block size)")
        kwargs["quantization_config"] = fp8_config(folder)
    return kwargs


@attrs.frozen(kw_only=True)
class LoadSettings:
    """How to load one checkpoint: the method, whether its weights are saved quantized, and the keyword arguments."""

    method: str
    pre_quantized: bool
    kwargs: dict[str, Any]


def load_settings(
    requested: str | None,
    devices: Sequence[str] | str | torch.device,
    folder: Path,
    env: loadable.Environment | None = None,
) -> LoadSettings:
    """:func:`resolve_method` then :func:`from_pretrained_kwargs`: one call before ``from_pretrained``."""
    method, pre_quantized = resolve_method(requested, folder)
    kwargs = from_pretrained_kwargs(method, devices, folder, pre_quantized=pre_quantized, env=env)
    return LoadSettings(method=method, pre_quantized=pre_quantized, kwargs=kwargs)


def _require_torchao() -> None:
    """torchao is installed at the series the engine is written against (``diffgemma_engine.loading.loadable``), and
    imported quietly."""
    installed = loadable.Environment(torchao=loadable.installed("torchao"), kernels=None)
    reason = loadable.refusal("int8", ("cpu",), installed)
    if reason is not None:
        raise ModelLoadError(reason)
    quiet = logging.getLogger("torchao")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its CUDA-only C++ extensions fail to load with a CPU torch: expected, not news
    try:
        import torchao  # noqa: F401
    finally:
        quiet.setLevel(level)


def int8_config() -> object:
    """transformers' ``TorchAoConfig``: int8 weight-only, per output row, for the experts' fused tensors and every
    text ``nn.Linear`` weight outside :func:`skip_patterns`."""
    _require_torchao()
    from torchao.quantization import FqnToConfig, Int8WeightOnlyConfig
    from torchao.quantization.granularity import PerRow
    from transformers import TorchAoConfig

    per_row = Int8WeightOnlyConfig(granularity=PerRow())
    experts = rf"re:.*\.experts\.(?:{'|'.join(EXPERT_WEIGHTS)})"
    # "re:" entries match a parameter's full name first: the experts' own tensors, then every other ".weight" the
    # skip list lets through (transformers' quantizer only offers nn.Linear weights and named parameters).
    return TorchAoConfig(
        FqnToConfig({experts: per_row, r"re:.*\.weight": per_row}),
        modules_to_not_convert=skip_patterns(),
    )


def fp8_config(folder: Path) -> object:
    """transformers' ``FineGrainedFP8Config`` with the skip list and the largest block that divides every converted
    matrix of the checkpoint in ``folder``."""
    from transformers import FineGrainedFP8Config

    from .plan import read_spec

    shapes = [weight.shape for weight in read_spec(folder).weights if weight.quantized]
    for block in BLOCK_SIZES:
        if all(shape[-1] % block == 0 and shape[-2] % block == 0 for shape in shapes):
            return FineGrainedFP8Config(modules_to_not_convert=skip_patterns(), weight_block_size=(block, block))
    raise ModelLoadError(
        f"fp8: no block of {', '.join(map(str, BLOCK_SIZES))} divides every converted matrix of {folder}"
    )


# -- after the load ------------------------------------------------------------------------------------------------


def is_quantized_tensor(tensor: object) -> bool:
    """A torchao tensor subclass, or float8 data."""
    import torch

    if type(tensor).__module__.startswith("torchao"):
        return True
    return isinstance(tensor, torch.Tensor) and tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def finish_load(model: PreTrainedModel, method: str, *, pre_quantized: bool = False) -> None:
    """What a quantized load needs after ``from_pretrained``, before ``quantize_check.verify_quantized``.

    fp8: tie the encoder's float8 scales to the decoder's (the load tied only what existed before the swap).
    torchao, quantized on the fly on CPU: copy the tensors left plain out of the checkpoint's memory map. In bfloat16
    they are views of the mapped files, and a few of them (``layer_scalar`` and the vision tower's buffers are views
    of views) keep every file mapped, with the pages of the weights read for quantizing: nearly the whole bfloat16
    checkpoint stays resident beside the int8 weights (``benchmarks/quantization.py`` measures the resident memory).
    A checkpoint saved quantized is read in place, as a bfloat16 one is: its mapped pages are the weights themselves.
    """
    import torch

    if method == "fp8":
        model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)
        model.tie_weights(recompute_mapping=False)
    if method in TORCHAO_METHODS and not pre_quantized:
        copies: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for module in model.modules():
                for parameter in module._parameters.values():
                    if parameter is None or is_quantized_tensor(parameter) or parameter.device.type != "cpu":
                        continue
                    if id(parameter) not in copies:  # tied: one Parameter object, copied once, still shared
                        parameter.data = parameter.data.clone()
                        copies[id(parameter)] = parameter
                for name, buffer in list(module._buffers.items()):
                    if buffer is None or buffer.device.type != "cpu":
                        continue
                    if id(buffer) not in copies:
                        copies[id(buffer)] = buffer.detach().clone()  # a new tensor: no view of the map left
                    module._buffers[name] = copies[id(buffer)]
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand freed heap pages back to the system (glibc ``malloc_trim``); a no-op elsewhere. Quantizing frees a
    bfloat16 copy of each weight in small pieces, which the allocator otherwise keeps."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def save_quantized(model: PreTrainedModel, folder: Path, **kwargs: Any) -> None:
    """``save_pretrained`` of a torchao-quantized model, the encoder's tied tensors left out as for plain weights.

    transformers finds tied tensors by their names; torchao's safetensors flattening renames a quantized tensor into
    its parts (``….experts._gate_up_proj_qdata``), so every encoder copy would be written a second time (the file
    larger than the bfloat16 one) and the reload would fail comparing the two (``aten.equal`` is not implemented for
    ``Int8Tensor``). The tied names are dropped before flattening; the reload ties them again.
    """
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        raise ModelLoadError("save_quantized needs a model loaded with a quantization_config")
    tied = set(model.all_tied_weights_keys)

    def state_dict_and_metadata(target: torch.nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
        state, metadata = flatten_tensor_state_dict({k: v for k, v in target.state_dict().items() if k not in tied})
        return state, metadata

    quantizer.get_state_dict_and_metadata = state_dict_and_metadata
    try:
        model.save_pretrained(folder, **kwargs)
    finally:
        del quantizer.get_state_dict_and_metadata
