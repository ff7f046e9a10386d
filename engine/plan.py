"""How much memory a checkpoint needs and where it would go, from its config alone: ``diffgemma-engine plan``.

The model is built on the meta device (shapes, no storage: 0.2 s for the 26B release) with its encoder and
decoder tied, as ``from_pretrained`` ties them, and described as a list of :class:`Weight` records; everything
after that is arithmetic on those records, pure and testable without torch:

* weights per precision: ``bfloat16`` and ``float32`` count every tensor at 2 or 4 bytes; ``int8`` stores the
  weights ``engine.quantize_policy`` converts at 1 byte plus a float32 scale and an int8 zero point per output row
  (torchao's layout), ``fp8`` at 1 byte plus a float32 scale per ``FP8_BLOCK`` x ``FP8_BLOCK`` block (transformers'
  fine-grained fp8), ``int4`` at half a byte plus one bfloat16 scale per group of ``INT4_GROUP_SIZE`` input
  weights, planned for its size only (``UNAVAILABLE``); what the policy keeps stays bfloat16;
* per request, at the model's canvas: the encoded prompt's keys and values and the denoising step's
  vocabulary-sized tensors (``STEP_VOCAB_TENSORS``);
* a placement per precision over the devices present or described (``--max-memory``), filled in order as
  accelerate's ``sequential`` device map fills them. Not by accelerate itself: its ``infer_auto_device_map``
  (1.15) fails on this model with an ``IndexError`` once it must split the encoder (every encoder weight is tied
  to a decoder weight, accelerate issues #958, #3308; transformers #46566), and transformers' own (5.24) skips the
  names ``named_parameters`` keeps for tied tensors and counts the tied 26B model as 1.1 GiB. Here the unit of
  placement is a no-split block (``model._no_split_modules``: a decoder layer, a vision layer) merged with every
  block it shares a tensor with: encoder layer *i* with decoder layer *i*, the three names of the embedding.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from . import shards
from .canvas.runtime import text_config_of
from .checkpoint_files import (
    DEFAULT_MODEL_DIR,
    MAX_INDEX_FILE_BYTES,
    canvas_length_of,
    read_json_object,
    stored_dtype,
)
from .errors import ModelLoadError, describe
from .folder_limits import check_folder
from .loadable import Environment, refusal
from .quantize_policy import EXPERT_WEIGHTS, MULTIMODAL_MODULES, stays_unquantized

if TYPE_CHECKING:
    import torch
    from transformers import DiffusionGemmaConfig

GIB = 1 << 30
MIB = 1 << 20
PRECISIONS: tuple[str, ...] = ("bfloat16", "float32", "fp8", "int8", "int4")
QUANTIZED: tuple[str, ...] = ("fp8", "int8", "int4")
INT4_GROUP_SIZE = 128
"""Input weights per int4 scale (the common choice of GPTQ, AWQ and torchao's int4 weight-only layouts)."""
SCALE_BYTES = 2
"""A quantization scale is one bfloat16."""
ELEMENT_BYTES = {"bfloat16": 2, "float32": 4}
KINDS: tuple[str, ...] = ("routed_experts", "linear", "embedding", "vision", "other")
"""Disjoint kinds of parameters: the fused expert tensors; the text stack's ``nn.Linear`` layers (attention, dense
MLP, router, self-conditioning); the token embedding, tied to the LM head; the vision tower and its embedder; the
rest (norms, scales)."""
STEP_VOCAB_TENSORS = 3.0
"""Vocabulary-sized (rows x canvas x vocab) float32 tensors alive at the peak of one eager denoising step of a
float32 model: this step's scaled logits (kept: the next step's self-conditioning), its probabilities, and the
previous step's logits while the decoder reads them, or the accepted rows' copy that
``engine.canvas.sampler.draw_tokens`` turns into their cumulative distribution in place. The entropy is taken
without log-probabilities and the previous step's logits are let go once the decoder has read them
(``engine.canvas.step.StepState.take_self_conditioning``; it was 5 before). Measured with a dispatch-mode tracker on
the small checkpoints (``tests/engine/test_plan.py``); ``exact`` sampling holds more."""
HALF_PRECISION_SAVING = 0.5
"""A bfloat16 model's logits, kept for self-conditioning, are half a float32 tensor (the scores are float32)."""
DEFAULT_PROMPT_TOKENS = 2048
PREFIX_CACHE_SLOTS = 16
"""Documents whose encoded prompt the engine keeps (``engine.canvas.caches.DEFAULT_SLOTS``)."""
FITS_GPU = "fits_gpu"
FITS_WITH_OFFLOAD = "fits_with_cpu_offload"
FITS_CPU = "fits_cpu"
DOES_NOT_FIT = "does_not_fit"
VERDICT_TEXT = {
    FITS_GPU: "fits on the GPU",
    FITS_WITH_OFFLOAD: "fits with CPU offload",
    FITS_CPU: "fits in CPU memory",
    DOES_NOT_FIT: "does not fit",
}
UNAVAILABLE: dict[str, str] = {
    "int4": "not available in the engine: torchao 0.18 has no int4 layout that runs the fused experts "
    "(the GGUF Q4_K_M and NVFP4 builds, with llama.cpp or vLLM, are the 4-bit route)"
}
"""Precisions planned for their size but never recommended: the engine cannot load them (``engine.quantize``)."""
GPU_PREFERENCE = ("bfloat16", "int8")
"""Recommended on an accelerator, first that fits wholly on it. fp8 is the size of int8 (and needs a GPU with fp8
support), so it is planned but chosen only when asked for (``--quantization fp8``)."""
OFFLOAD_PREFERENCE = ("int8", "bfloat16")
"""When nothing fits on the accelerators: the smallest first, so the least is offloaded."""
CPU_PREFERENCE = ("float32", "bfloat16", "int8")
"""On CPU alone: float32 first (CPUs compute it fastest), then the checkpoint's bfloat16."""
INT8_ROW_BYTES = 5
"""torchao's int8 (``Int8Tensor``): a float32 scale and an int8 zero point per output row."""
FP8_BLOCK = 64
"""transformers' fine-grained fp8 on the release: a float32 scale per 64 x 64 block (``engine.quantize``)."""


class PlanError(ValueError):
    """A ``--max-memory`` or ``--device`` that cannot be planned for."""


@attrs.frozen(kw_only=True)
class Weight:
    """One tensor of the model (each shared tensor once, under the first name ``named_modules`` gives it)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    unit: str
    """The placement unit it belongs to: tensors of one unit always go to the same device."""
    buffer: bool = False
    linear: bool = False
    """Held by an ``nn.Linear`` (the vision tower's included)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def quantized(self) -> bool:
        """Converted by a quantizer (``engine.quantize_policy``); buffers never are."""
        return not self.buffer and len(self.shape) >= 2 and not stays_unquantized(self.name)


@attrs.frozen(kw_only=True)
class AttentionLayer:
    """What one layer caches per prompt token: a key and a value of ``kv_width`` (kv heads x head dim) each."""

    kv_width: int
    window: int | None
    """The sliding window; None for full attention."""


@attrs.frozen(kw_only=True)
class StoredCheckpoint:
    """What the folder says about its weights, if it has any."""

    dtype: str | None
    bytes: int | None
    source: str | None
    missing: tuple[str, ...] = ()
    """Weight files the folder names that are missing or cut short (``engine.shards``): the engine refuses to
    load it until they are there."""


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A checkpoint's shape, read from its config: the input of :func:`make_plan`."""

    folder: str
    architecture: str
    weights: tuple[Weight, ...]
    parameters_before_tie: int
    attention: tuple[AttentionLayer, ...]
    canvas_length: int
    vocab_size: int
    stored: StoredCheckpoint
    build_s: float
    members: tuple[tuple[str, str], ...] = ()
    """(module, unit) for the modules a device map names, under each of their names: every tensor is in one of
    them; the decoder's tied blocks go where their encoder twins go."""

    @property
    def parameters(self) -> int:
        return sum(weight.numel for weight in self.weights if not weight.buffer)


@attrs.frozen(kw_only=True)
class Device:
    """A device and the bytes the plan may use on it."""

    name: str
    """``cuda:N``, ``mps`` or ``cpu``."""
    bytes: int
    source: str

    @property
    def accelerator(self) -> bool:
        return self.name != "cpu"


@attrs.frozen(kw_only=True)
class RequestMemory:
    """What one request needs beside the weights, for activations of ``dtype``."""

    dtype: str
    canvas_length: int
    prompt_tokens: int
    rows: int
    kv_bytes_per_token: int
    """Every layer's key and value for one prompt token."""
    kv_bytes_per_token_sliding: int
    kv_bytes_per_token_full: int
    kv_prompt_bytes: int
    """A cache of ``prompt_tokens`` with the sliding layers holding their window (``window - 1`` tokens)."""
    kv_engine_document_bytes: int
    """What the engine's prefix cache keeps for one document of ``prompt_tokens``: a master of every token on every
    layer (so it can be cut back), plus the decoder view's copy of the sliding layers' window."""
    step_tensor_bytes: int
    """One vocabulary-sized float32 tensor for one row: canvas x vocab x 4."""
    step_tensors: float
    step_bytes: int
    """``step_tensors`` of them, per row."""

    @property
    def reserve_bytes(self) -> int:
        """Kept free on the first device: the document caches and step tensors of ``rows`` requests."""
        return self.rows * (self.kv_engine_document_bytes + self.step_bytes)


@attrs.frozen(kw_only=True)
class DeviceShare:
    """One device's part of a placement."""

    device: str
    capacity_bytes: int
    weights_bytes: int
    reserved_bytes: int
    units: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Placement:
    """Where the weights of one precision go, and whether they fit."""

    precision: str
    verdict: str
    shares: tuple[DeviceShare, ...]
    unplaced_bytes: int
    setting: str | None
    """The engine options for it (None when it does not fit, or cannot load there: ``refused``)."""
    refused: str | None = None
    """Why the loader would refuse this precision on the devices it uses (``engine.loadable.refusal``)."""

    @property
    def used_devices(self) -> tuple[str, ...]:
        return tuple(share.device for share in self.shares if share.units)


@attrs.frozen(kw_only=True)
class Plan:
    """Everything ``diffgemma-engine plan`` reports."""

    spec: ModelSpec
    weights_bytes: dict[str, int]
    """Every weight the checkpoint holds, per precision."""
    loaded_bytes: dict[str, int]
    """What the engine loads, per precision: text only, the vision tower and its embedder left out
    (:func:`text_weights`); the placements place these."""
    shares: dict[str, float]
    linear_anywhere_share: float
    """Every ``nn.Linear`` wherever it sits (the vision tower's too): the release README's measure."""
    quantized_share: float
    requests: dict[str, RequestMemory]
    """Per activation dtype: ``bfloat16`` (every precision but float32) and ``float32``."""
    devices: tuple[Device, ...]
    placements: tuple[Placement, ...]
    recommendation: Placement | None


# -- arithmetic ------------------------------------------------------------------------------------------------


def kind_of(name: str, *, linear: bool, embedding: bool) -> str:
    """The :data:`KINDS` entry of a tensor, from its name and the class of the module that holds it."""
    parts = name.split(".")
    if any(part in MULTIMODAL_MODULES for part in parts):
        return "vision"
    if parts[-1] in EXPERT_WEIGHTS and len(parts) >= 2 and parts[-2] == "experts":
        return "routed_experts"
    if embedding or parts[0] == "lm_head":
        return "embedding"
    return "linear" if linear else "other"


def weight_bytes(weight: Weight, precision: str) -> int:
    """Bytes of ``weight`` stored at ``precision`` (see the module docstring for the quantized layouts)."""
    count = weight.numel
    if precision == "float32":
        return 4 * count
    if precision == "bfloat16" or not weight.quantized:
        return 2 * count
    rows = count // weight.shape[-1]
    if precision == "int8":
        return count + rows * INT8_ROW_BYTES
    if precision == "fp8":
        matrices = count // (weight.shape[-2] * weight.shape[-1])
        blocks = math.ceil(weight.shape[-2] / FP8_BLOCK) * math.ceil(weight.shape[-1] / FP8_BLOCK)
        return count + matrices * blocks * 4
    if precision == "int4":
        return (count + 1) // 2 + rows * math.ceil(weight.shape[-1] / INT4_GROUP_SIZE) * SCALE_BYTES
    raise PlanError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")


def total_bytes(weights: Iterable[Weight], precision: str) -> int:
    return sum(weight_bytes(weight, precision) for weight in weights)


def kind_shares(weights: Sequence[Weight]) -> dict[str, float]:
    """Each kind's share of the parameters (by count; buffers left out)."""
    parameters = [weight for weight in weights if not weight.buffer]
    total = sum(weight.numel for weight in parameters) or 1
    return {kind: sum(w.numel for w in parameters if w.kind == kind) / total for kind in KINDS}


def activation_dtype(precision: str) -> str:
    """Quantized weights compute in bfloat16; float32 weights in float32."""
    return "float32" if precision == "float32" else "bfloat16"


def request_memory(
    layers: Sequence[AttentionLayer],
    *,
    canvas_length: int,
    vocab_size: int,
    prompt_tokens: int,
    dtype: str = "bfloat16",
    rows: int = 1,
) -> RequestMemory:
    """The per-request memory of a model with ``layers``; keys and values are stored in ``dtype``."""
    element = ELEMENT_BYTES[dtype]
    per_layer = [2 * layer.kv_width * element for layer in layers]  # a key and a value
    sliding = sum(size for size, layer in zip(per_layer, layers, strict=True) if layer.window is not None)
    full = sum(size for size, layer in zip(per_layer, layers, strict=True) if layer.window is None)
    windowed = 0
    copies = 0
    for size, layer in zip(per_layer, layers, strict=True):
        if layer.window is None:
            windowed += size * prompt_tokens
            continue
        keep = layer.window - 1
        windowed += size * min(prompt_tokens, keep)
        if prompt_tokens > keep:  # engine.canvas.caches.decoder_view copies the window out of the master
            copies += size * keep
    step_tensor = canvas_length * vocab_size * 4
    step_tensors = STEP_VOCAB_TENSORS - (HALF_PRECISION_SAVING if dtype != "float32" else 0.0)
    return RequestMemory(
        dtype=dtype,
        canvas_length=canvas_length,
        prompt_tokens=prompt_tokens,
        rows=rows,
        kv_bytes_per_token=sliding + full,
        kv_bytes_per_token_sliding=sliding,
        kv_bytes_per_token_full=full,
        kv_prompt_bytes=windowed,
        kv_engine_document_bytes=(sliding + full) * prompt_tokens + copies,
        step_tensor_bytes=step_tensor,
        step_tensors=step_tensors,
        step_bytes=round(step_tensors * step_tensor),
    )


CACHE_SHARE = 0.25
"""Of the memory free once the weights are in, what the prefix cache may hold."""
STEP_SHARE = 0.5
"""Of it, what the rows of one denoising step (a batch, or a request's candidates) may take."""


@attrs.frozen(kw_only=True)
class ServingLimits:
    """What the engine keeps and runs at once, from the memory left after loading."""

    cache_slots: int
    """Documents whose encoded prompt is kept."""
    rows: int
    """Canvas rows denoised together: batched requests, or one request's candidates."""


def serving_limits(free_bytes: int, request: RequestMemory, max_slots: int, max_rows: int) -> ServingLimits:
    """``CACHE_SHARE`` of ``free_bytes`` for cached prompts (each ``request.kv_engine_document_bytes``) and
    ``STEP_SHARE`` for step rows (each ``request.step_bytes``), within ``max_slots`` / ``max_rows``; at least one
    of each (a request is always tried: out of memory, the engine sheds what it can)."""
    slots = int(free_bytes * CACHE_SHARE) // max(request.kv_engine_document_bytes, 1)
    rows = int(free_bytes * STEP_SHARE) // max(request.step_bytes, 1)
    return ServingLimits(cache_slots=max(1, min(max_slots, slots)), rows=max(1, min(max_rows, rows)))


def text_weights(weights: Sequence[Weight]) -> list[Weight]:
    """The weights a text-only load holds: all but the vision tower and its embedder (``engine.text_only``)."""
    return [weight for weight in weights if weight.kind != "vision"]


def placement_units(weights: Sequence[Weight], precision: str) -> list[tuple[str, int]]:
    """(unit, bytes) in model order, the vision tower's units last: never run for code, they are offloaded first."""
    sizes: dict[str, int] = {}
    vision: dict[str, bool] = {}
    for weight in weights:
        sizes[weight.unit] = sizes.get(weight.unit, 0) + weight_bytes(weight, precision)
        vision[weight.unit] = vision.get(weight.unit, True) and weight.kind == "vision"
    order = {unit: index for index, unit in enumerate(sizes)}
    return sorted(sizes.items(), key=lambda item: (vision[item[0]], order[item[0]]))


def _fill(
    units: Sequence[tuple[str, int]], devices: Sequence[Device], reserved: dict[str, int]
) -> tuple[list[list[str]], list[int], int]:
    """Fill the devices in order, moving to the next one when a unit does not fit (never back)."""
    budgets = [device.bytes - reserved.get(device.name, 0) for device in devices]
    placed: list[list[str]] = [[] for _ in devices]
    used = [0] * len(devices)
    unplaced = 0
    current = 0
    for name, size in units:
        while current < len(devices) and used[current] + size > budgets[current]:
            current += 1
        if current == len(devices):
            unplaced += size
            continue
        used[current] += size
        placed[current].append(name)
    return placed, used, unplaced


def place(
    units: Sequence[tuple[str, int]],
    devices: Sequence[Device],
    precision: str,
    request_bytes: int,
    stored_dtype: str = "bfloat16",
) -> Placement:
    """Where ``units`` go on ``devices`` (accelerators first, then CPU), ``request_bytes`` kept on the first.

    With anything on the CPU and an accelerator in use, the first accelerator also keeps room for the largest unit,
    as accelerate's offload hooks bring an offloaded layer in to run it.
    """
    ordered = sort_devices(devices)
    reserved = {ordered[0].name: request_bytes} if ordered else {}
    placed, used, unplaced = _fill(units, ordered, reserved)
    on_cpu = any(names for device, names in zip(ordered, placed, strict=True) if not device.accelerator)
    on_accelerator = any(names for device, names in zip(ordered, placed, strict=True) if device.accelerator)
    if on_cpu and on_accelerator and units:
        first = next(device.name for device in ordered if device.accelerator)
        reserved[first] = reserved.get(first, 0) + max(size for _, size in units)
        placed, used, unplaced = _fill(units, ordered, reserved)
        on_cpu = any(names for device, names in zip(ordered, placed, strict=True) if not device.accelerator)
        on_accelerator = any(names for device, names in zip(ordered, placed, strict=True) if device.accelerator)
    if unplaced or not units:
        verdict = DOES_NOT_FIT
    elif on_accelerator:
        verdict = FITS_WITH_OFFLOAD if on_cpu else FITS_GPU
    else:
        verdict = FITS_CPU
    shares = tuple(
        DeviceShare(
            device=device.name,
            capacity_bytes=device.bytes,
            weights_bytes=used[index],
            reserved_bytes=reserved.get(device.name, 0),
            units=tuple(placed[index]),
        )
        for index, device in enumerate(ordered)
    )
    used_devices = [share.device for share in shares if share.units]
    usable = verdict != DOES_NOT_FIT and precision not in UNAVAILABLE
    setting = engine_setting(precision, used_devices, stored_dtype) if usable else None
    return Placement(precision=precision, verdict=verdict, shares=shares, unplaced_bytes=unplaced, setting=setting)


def engine_setting(precision: str, devices: Sequence[str], stored_dtype: str = "bfloat16") -> str:
    """The engine options for ``precision`` on ``devices``: ``--device cuda:0,1`` (``,cpu`` when offloaded), then
    ``--quantization``, or the ``--dtype`` when it is not the checkpoint's own (``stored_dtype``, what ``auto``
    loads)."""
    gpus = [name.removeprefix("cuda:") for name in devices if name.startswith("cuda")]
    names = ([f"cuda:{','.join(gpus)}"] if gpus else []) + [name for name in ("mps", "cpu") if name in devices]
    options = [f"--device {','.join(names)}"]
    if precision in QUANTIZED:
        options.append(f"--quantization {precision}")
    elif precision != stored_dtype:
        options.append(f"--dtype {precision}")
    return " ".join(options)


def recommend(placements: Sequence[Placement]) -> Placement | None:
    """The placement to use: the best precision wholly on accelerators, else the least offloaded one, else CPU."""
    by_precision = {p.precision: p for p in placements if p.precision not in UNAVAILABLE}
    for verdict, preference in (
        (FITS_GPU, GPU_PREFERENCE),
        (FITS_WITH_OFFLOAD, OFFLOAD_PREFERENCE),
        (FITS_CPU, CPU_PREFERENCE),
    ):
        for precision in preference + tuple(p for p in by_precision if p not in preference):
            placement = by_precision.get(precision)
            if placement is not None and placement.setting is not None and placement.verdict == verdict:
                return placement
    return None


def make_plan(
    spec: ModelSpec,
    devices: Sequence[Device],
    *,
    precisions: Sequence[str] = PRECISIONS,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    rows: int = 1,
    env: Environment | None = None,
) -> Plan:
    """The plan of ``spec`` on ``devices``; placements (and the recommendation) only for ``precisions``. With
    ``env`` (``engine.loadable.environment()`` for this machine), a placement the loader would refuse there (int8
    on MPS, fp8 without its kernel or with offload) gets no setting, and says why: every setting the plan gives or
    recommends is one ``load_model`` accepts. Without it, the arithmetic alone."""
    if prompt_tokens < 1 or rows < 1:
        raise PlanError(f"a plan needs at least one prompt token and one row, not {prompt_tokens} and {rows}")
    for precision in precisions:
        if precision not in PRECISIONS:
            raise PlanError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    weights = spec.weights
    loaded = text_weights(weights)
    requests = {
        dtype: request_memory(
            spec.attention,
            canvas_length=spec.canvas_length,
            vocab_size=spec.vocab_size,
            prompt_tokens=prompt_tokens,
            dtype=dtype,
            rows=rows,
        )
        for dtype in ("bfloat16", "float32")
    }
    placements = tuple(
        place(
            placement_units(loaded, precision),
            devices,
            precision,
            requests[activation_dtype(precision)].reserve_bytes,
            spec.stored.dtype or "float32",
        )
        for precision in precisions
    )
    if env is not None:
        placements = tuple(_checked(placement, env) for placement in placements)
    parameters = [weight for weight in weights if not weight.buffer]
    total = sum(weight.numel for weight in parameters) or 1
    return Plan(
        spec=spec,
        weights_bytes={precision: total_bytes(weights, precision) for precision in PRECISIONS},
        loaded_bytes={precision: total_bytes(loaded, precision) for precision in PRECISIONS},
        shares=kind_shares(weights),
        linear_anywhere_share=sum(w.numel for w in parameters if w.linear) / total,
        quantized_share=sum(w.numel for w in parameters if w.quantized) / total,
        requests=requests,
        devices=tuple(sort_devices(devices)),
        placements=placements,
        recommendation=recommend(placements),
    )


def _checked(placement: Placement, env: Environment) -> Placement:
    """``placement`` without its setting when the loader would refuse it on the devices it uses, with the reason."""
    if placement.setting is None and placement.verdict == DOES_NOT_FIT:
        return placement
    reason = refusal(placement.precision, placement.used_devices, env)
    return placement if reason is None else attrs.evolve(placement, setting=None, refused=reason)


def advice(plan: Plan, precision: str) -> str:
    """One line for a load that cannot go as asked: what ``precision`` needs, what the devices have free, and what
    the plan recommends instead."""
    request = plan.requests[activation_dtype(precision)]
    free = ", ".join(f"{device.name} {_gib(device.bytes):.1f} GiB" for device in plan.devices)
    line = (
        f"the weights need {_gib(plan.loaded_bytes[precision]):.1f} GiB in {precision}, and a request "
        f"{_gib(request.reserve_bytes):.1f} GiB more; free: {free}"
    )
    chosen = plan.recommendation
    if chosen is None:
        return line + "; nothing fits these devices: add cpu or disk to --device"
    size = _gib(plan.loaded_bytes[chosen.precision])
    verdict = chosen.verdict.replace("_", " ")
    return f"{line}; use {chosen.setting} ({chosen.precision}: {size:.1f} GiB, {verdict})"


# -- devices ---------------------------------------------------------------------------------------------------

MEMINFO = Path("/proc/meminfo")
"""Where the CPU's available memory is read (Linux; elsewhere ``sysconf``)."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20}
_UNITS |= {"gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of ``24GiB``, ``24GB`` (decimal, as accelerate reads it), ``512MiB`` or a plain number of bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise PlanError(f"cannot read the size {text!r}: write it like 24GiB, 24GB or 512MiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()])


def device_name(key: str) -> str:
    """``cuda:N``, ``mps`` or ``cpu`` for a device key: ``0`` and ``cuda`` (accelerate's style) are CUDA devices."""
    key = key.strip().lower()
    if key.isdigit():
        return f"cuda:{int(key)}"
    if key == "cuda":
        return "cuda:0"
    if key.startswith("cuda:") and key[5:].isdigit():
        return f"cuda:{int(key[5:])}"
    if key in ("mps", "cpu"):
        return key
    raise PlanError(f"unknown device {key!r}: use cuda:N (or N), mps or cpu (disk offload is not planned)")


def sort_devices(devices: Iterable[Device]) -> list[Device]:
    """CUDA devices by index, then MPS, then the CPU: the order they are filled in."""

    def key(device: Device) -> tuple[int, int]:
        if device.name.startswith("cuda:"):
            return (0, int(device.name[5:]))
        return (1, 0) if device.name == "mps" else (2, 0)

    return sorted(devices, key=key)


def parse_max_memory(spec: str) -> list[Device]:
    """Devices described as accelerate's ``max_memory``: ``cuda:0=24GiB,cpu=64GiB`` (or ``0=24GiB,cpu=64GiB``)."""
    devices: dict[str, Device] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PlanError(f"--max-memory: {item!r} is not DEVICE=SIZE (e.g. cuda:0=24GiB,cpu=64GiB)")
        name = device_name(key)
        if name in devices:
            raise PlanError(f"--max-memory names {name} twice")
        devices[name] = Device(name=name, bytes=parse_size(value), source="--max-memory")
    if not devices:
        raise PlanError("--max-memory is empty: describe devices like cuda:0=24GiB,cpu=64GiB")
    return sort_devices(devices.values())


def select_devices(devices: Sequence[Device], spec: str | None) -> list[Device]:
    """The devices ``--device`` names (``auto``: all of them): ``cpu``, ``cuda`` (every CUDA device), ``cuda:0``,
    ``cuda:0,1`` or ``cuda:0,cpu``."""
    if spec in (None, "", "auto"):
        return sort_devices(devices)
    available = {device.name: device for device in devices}
    wanted: list[str] = []
    for item in filter(None, (part.strip().lower() for part in spec.split(","))):
        if item == "cuda":
            wanted += [name for name in available if name.startswith("cuda:")] or ["cuda:0"]
        elif item.isdigit() and wanted and wanted[-1].startswith("cuda:"):
            wanted.append(f"cuda:{int(item)}")
        else:
            wanted.append(device_name(item))
    missing = [name for name in wanted if name not in available]
    if missing:
        found = ", ".join(available) or "none"
        raise PlanError(f"--device {spec}: no {', '.join(missing)} here (devices: {found})")
    return sort_devices(available[name] for name in dict.fromkeys(wanted))


def cpu_memory() -> Device:
    """The CPU and the memory available to a new process (``MemAvailable``, else free pages)."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Device(name="cpu", bytes=int(line.split()[1]) * 1024, source=f"{MEMINFO} MemAvailable")
    except (OSError, ValueError, IndexError):
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return Device(name="cpu", bytes=os.sysconf(name) * page, source=f"sysconf {name}")
        except (ValueError, OSError):
            continue
    return Device(name="cpu", bytes=0, source="unknown")


def detect_devices() -> list[Device]:
    """The devices of this machine: each CUDA device's free memory, MPS's recommended limit, the CPU's RAM.

    On Apple silicon MPS and the CPU share one memory: the CPU is given what is left of it beside MPS's limit, so a
    placement over ``mps,cpu`` never counts a byte twice.
    """
    import torch

    found: list[Device] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            free, _total = torch.cuda.mem_get_info(index)
            found.append(Device(name=f"cuda:{index}", bytes=int(free), source="torch.cuda.mem_get_info (free)"))
    cpu = cpu_memory()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        limit = int(torch.mps.recommended_max_memory())
        found.append(Device(name="mps", bytes=limit, source="torch.mps.recommended_max_memory"))
        cpu = Device(name="cpu", bytes=max(0, cpu.bytes - limit), source=f"{cpu.source} less MPS's limit (one memory)")
    found.append(cpu)
    return sort_devices(found)


# -- the model on the meta device ------------------------------------------------------------------------------


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

    def unit_of(module_name: str) -> str:
        """The outermost no-split ancestor of ``module_name``, else the module itself."""
        parts = module_name.split(".") if module_name else []
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if classes.get(prefix) in no_split:
                return prefix
        return module_name

    roots: dict[str, str] = {}

    def root(unit: str) -> str:
        while roots.setdefault(unit, unit) != unit:
            unit = roots[unit]
        return unit

    first: dict[int, tuple[str, tuple[int, ...], str, bool, bool, str]] = {}
    holders: dict[str, str] = {}
    before_tie = 0
    for module_name, module in modules:
        unit = unit_of(module_name)
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
    # A device map cannot send a module one way and one of its submodules another (accelerate places a mapped
    # module whole): a module that holds tensors itself and contains other holders (the vision tower's scale and
    # bias) makes one unit with them, and only it is a key.
    keys = sorted(holders)
    for index, key in enumerate(keys):
        for ancestor in keys[:index]:
            if key.startswith(ancestor + ".") and ancestor in holders:
                a, b = root(holders[ancestor]), root(holders.pop(key))
                if a != b:
                    roots[b] = a
                break
    weights = [
        Weight(name=name, shape=shape, kind=kind, unit=root(unit), buffer=is_buffer, linear=linear)
        for name, shape, kind, is_buffer, linear, unit in first.values()
    ]
    return weights, before_tie, [(key, root(unit)) for key, unit in holders.items()]


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


# -- output ----------------------------------------------------------------------------------------------------


def _gib(count: float) -> float:
    return round(count / GIB, 3)


def _request_json(request: RequestMemory) -> dict[str, Any]:
    return {
        "dtype": request.dtype,
        "canvas_length": request.canvas_length,
        "prompt_tokens": request.prompt_tokens,
        "rows": request.rows,
        "kv_bytes_per_token": request.kv_bytes_per_token,
        "kv_bytes_per_token_sliding": request.kv_bytes_per_token_sliding,
        "kv_bytes_per_token_full": request.kv_bytes_per_token_full,
        "kv_prompt_bytes": request.kv_prompt_bytes,
        "kv_engine_document_bytes": request.kv_engine_document_bytes,
        "step_tensor_bytes": request.step_tensor_bytes,
        "step_tensor_mib": round(request.step_tensor_bytes / MIB, 1),
        "step_tensors": request.step_tensors,
        "step_bytes": request.step_bytes,
        "reserve_bytes": request.reserve_bytes,
    }


def _placement_json(placement: Placement) -> dict[str, Any]:
    return {
        "precision": placement.precision,
        "verdict": placement.verdict,
        "fits": placement.verdict != DOES_NOT_FIT,
        "setting": placement.setting,
        "refused": placement.refused,
        "unplaced_gib": _gib(placement.unplaced_bytes),
        "devices": {
            share.device: {
                "weights_gib": _gib(share.weights_bytes),
                "reserved_gib": _gib(share.reserved_bytes),
                "capacity_gib": _gib(share.capacity_bytes),
                "units": list(share.units),
            }
            for share in placement.shares
        },
    }


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as one JSON object."""
    spec = plan.spec
    return {
        "model": spec.folder,
        "architecture": spec.architecture,
        "build_s": round(spec.build_s, 3),
        "parameters": spec.parameters,
        "parameters_before_tie": spec.parameters_before_tie,
        "buffers": sum(weight.numel for weight in spec.weights if weight.buffer),
        "stored": {
            "dtype": spec.stored.dtype,
            "bytes": spec.stored.bytes,
            "source": spec.stored.source,
            "missing": list(spec.stored.missing),
        },
        "weights_gib": {precision: _gib(count) for precision, count in plan.weights_bytes.items()},
        "weights_bytes": dict(plan.weights_bytes),
        "loaded_gib": {precision: _gib(count) for precision, count in plan.loaded_bytes.items()},
        "loaded_bytes": dict(plan.loaded_bytes),
        "text_only": {
            "not_loaded": list(MULTIMODAL_MODULES),
            "saved_bytes": {p: plan.weights_bytes[p] - plan.loaded_bytes[p] for p in PRECISIONS},
            "saved_parameters": sum(w.numel for w in spec.weights if w.kind == "vision" and not w.buffer),
        },
        "quantization": {
            "int4_group_size": INT4_GROUP_SIZE,
            "scale_dtype": "bfloat16",
            "int8_scales": "a float32 scale and an int8 zero point per output row",
            "fp8_scales": f"a float32 scale per {FP8_BLOCK}x{FP8_BLOCK} block",
            "unavailable": dict(UNAVAILABLE),
            "quantized_share": round(plan.quantized_share, 4),
        },
        "shares": {kind: round(share, 4) for kind, share in plan.shares.items()},
        "linear_anywhere_share": round(plan.linear_anywhere_share, 4),
        "requests": {dtype: _request_json(request) for dtype, request in plan.requests.items()},
        "prefix_cache_slots": PREFIX_CACHE_SLOTS,
        "devices": [{"name": d.name, "gib": _gib(d.bytes), "source": d.source} for d in plan.devices],
        "placements": {placement.precision: _placement_json(placement) for placement in plan.placements},
        "recommendation": (
            None
            if plan.recommendation is None
            else {
                "precision": plan.recommendation.precision,
                "verdict": plan.recommendation.verdict,
                "setting": plan.recommendation.setting,
            }
        ),
    }


def _size(count: float) -> str:
    if count >= GIB:
        return f"{count / GIB:.1f} GiB"
    if count >= MIB:
        return f"{count / MIB:.0f} MiB"
    return f"{count / 1024:.1f} KiB"


def _units_range(units: Sequence[str]) -> str:
    if not units:
        return "nothing"
    if len(units) == 1:
        return units[0]
    return f"{len(units)} units, {units[0]} .. {units[-1]}"


def format_plan(plan: Plan) -> str:
    """The plan as text for a person."""
    spec = plan.spec
    bf16 = plan.requests["bfloat16"]
    names = {"routed_experts": "routed experts", "linear": "linear layers", "embedding": "embedding/LM head"}
    names |= {"vision": "vision tower", "other": "other"}
    vision_parameters = sum(weight.numel for weight in spec.weights if weight.kind == "vision" and not weight.buffer)
    lines = [
        f"{spec.architecture} in {spec.folder}: built on the meta device in {spec.build_s:.2f} s, no weights loaded",
        f"  parameters: {spec.parameters / 1e9:.2f} B after the encoder/decoder tie "
        f"({spec.parameters_before_tie / 1e9:.2f} B before)",
    ]
    if spec.stored.bytes is not None:
        lines.append(
            f"  stored: {spec.stored.dtype or 'unknown dtype'}, {_size(spec.stored.bytes)} ({spec.stored.source})"
        )
    if spec.stored.missing:
        lines.append(
            f"  incomplete: {'; '.join(spec.stored.missing)}: the engine will not load this folder until they are there"
        )
    lines += [
        "  weights: " + ", ".join(f"{p} {plan.weights_bytes[p] / GIB:.1f} GiB" for p in PRECISIONS),
        f"    loaded, text only: {plan.loaded_bytes['bfloat16'] / GIB:.1f} GiB in bf16; the vision tower and its "
        f"embedder ({vision_parameters / 1e9:.2f} B parameters, "
        f"{_size(plan.weights_bytes['bfloat16'] - plan.loaded_bytes['bfloat16'])} in bf16) are never read: code "
        "completion sends no image",
        f"    quantized: {plan.quantized_share:.1%} of the parameters (routed experts and text linear layers); "
        f"int8 1 byte + 5 bytes per row, fp8 1 byte + 4 bytes per {FP8_BLOCK}x{FP8_BLOCK} block, int4 0.5 byte + a "
        f"bf16 scale per {INT4_GROUP_SIZE} weights; embedding/LM head, router, norms, biases and vision tower stay "
        "bf16",
        "  by kind: "
        + ", ".join(f"{names[kind]} {share:.1%}" for kind, share in plan.shares.items())
        + f" (nn.Linear anywhere: {plan.linear_anywhere_share:.1%})",
        f"  per request (canvas {bf16.canvas_length}, bf16 activations; float32 doubles the cache):",
        f"    prefix cache: {_size(bf16.kv_bytes_per_token)} per prompt token "
        f"(sliding layers {_size(bf16.kv_bytes_per_token_sliding)}, full {_size(bf16.kv_bytes_per_token_full)}); "
        f"{_size(bf16.kv_prompt_bytes)} for {bf16.prompt_tokens} tokens with sliding layers at their window; "
        f"the engine keeps {_size(bf16.kv_engine_document_bytes)} per document (every token on every layer, plus "
        f"the window's copy), for up to {PREFIX_CACHE_SLOTS} documents",
        f"    step: {bf16.step_tensors:g} x {_size(bf16.step_tensor_bytes)} vocabulary-sized tensors = "
        f"{_size(bf16.step_bytes)} per canvas row (serve --max-batch N runs N rows)",
        f"    kept free on the first device: {_size(bf16.reserve_bytes)} for {bf16.rows} row(s)",
        "  devices: " + (", ".join(f"{d.name} {_size(d.bytes)} ({d.source})" for d in plan.devices) or "none"),
    ]
    for placement in plan.placements:
        where = ", ".join(f"{share.device} {_size(share.weights_bytes)}" for share in placement.shares if share.units)
        if placement.unplaced_bytes:
            where += f"{', ' if where else ''}{_size(placement.unplaced_bytes)} left over"
        setting = f"   {placement.setting}" if placement.setting else ""
        if placement.refused is not None:
            setting = f"   (not here: {placement.refused})"
        elif placement.precision in UNAVAILABLE:
            setting = f"   ({UNAVAILABLE[placement.precision]})"
        lines.append(f"  {placement.precision:9s} {VERDICT_TEXT[placement.verdict]:22s} {where}{setting}")
        for share in placement.shares:
            if share.units and len(plan.devices) > 1:
                lines.append(f"      {share.device}: {_units_range(share.units)}")
    if plan.recommendation is None:
        lines.append("  use: nothing fits these devices")
    else:
        verdict = VERDICT_TEXT[plan.recommendation.verdict]
        lines.append(f"  use: {plan.recommendation.setting}  ({plan.recommendation.precision} {verdict})")
    return "\n".join(lines)
