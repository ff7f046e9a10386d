"""The plan's arithmetic: bytes per precision, per request, placements filled in order, the recommendation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import attrs

from ..loadable import Environment, refusal
from ..quantize_policy import EXPERT_WEIGHTS, MULTIMODAL_MODULES
from .devices import sort_devices
from .records import (
    CPU_PREFERENCE,
    DEFAULT_PROMPT_TOKENS,
    DOES_NOT_FIT,
    ELEMENT_BYTES,
    FITS_CPU,
    FITS_GPU,
    FITS_WITH_OFFLOAD,
    FP8_BLOCK,
    GPU_PREFERENCE,
    HALF_PRECISION_SAVING,
    INT4_GROUP_SIZE,
    INT8_ROW_BYTES,
    KINDS,
    OFFLOAD_PREFERENCE,
    PRECISIONS,
    QUANTIZED,
    SCALE_BYTES,
    STEP_VOCAB_TENSORS,
    UNAVAILABLE,
    AttentionLayer,
    Device,
    DeviceShare,
    ModelSpec,
    Placement,
    Plan,
    PlanError,
    RequestMemory,
    Weight,
    gib,
)

if TYPE_CHECKING:
    pass


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
        if prompt_tokens > keep:  # canvas.caches.decoder_view copies the window out of the master
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
    """The weights a text-only load holds: all but the vision tower and its embedder
    (``diffgemma_engine.loading.text_only``)."""
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
    ``env`` (``diffgemma_engine.loading.loadable.environment()`` for this machine), a placement the loader would refuse
    there (int8 on MPS, fp8 without its kernel or with offload) gets no setting, and says why: every setting the plan
    gives or recommends is one ``load_model`` accepts. Without it, the arithmetic alone."""
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
    free = ", ".join(f"{device.name} {gib(device.bytes):.1f} GiB" for device in plan.devices)
    line = (
        f"the weights need {gib(plan.loaded_bytes[precision]):.1f} GiB in {precision}, and a request "
        f"{gib(request.reserve_bytes):.1f} GiB more; free: {free}"
    )
    chosen = plan.recommendation
    if chosen is None:
        return line + "; nothing fits these devices: add cpu or disk to --device"
    size = gib(plan.loaded_bytes[chosen.precision])
    verdict = chosen.verdict.replace("_", " ")
    return f"{line}; use {chosen.setting} ({chosen.precision}: {size:.1f} GiB, {verdict})"
