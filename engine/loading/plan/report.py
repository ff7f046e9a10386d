"""The plan as JSON and as text for a person (``diffgemma-engine plan [--json]``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...shared.units import count_text, size_text
from ..quantize_policy import MULTIMODAL_MODULES
from .records import (
    DOES_NOT_FIT,
    FP8_BLOCK,
    INT4_GROUP_SIZE,
    MIB,
    PRECISIONS,
    PREFIX_CACHE_SLOTS,
    UNAVAILABLE,
    VERDICT_TEXT,
    Placement,
    Plan,
    RequestMemory,
    gib,
)

if TYPE_CHECKING:
    pass


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
        "unplaced_gib": gib(placement.unplaced_bytes),
        "devices": {
            share.device: {
                "weights_gib": gib(share.weights_bytes),
                "reserved_gib": gib(share.reserved_bytes),
                "capacity_gib": gib(share.capacity_bytes),
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
        "weights_gib": {precision: gib(count) for precision, count in plan.weights_bytes.items()},
        "weights_bytes": dict(plan.weights_bytes),
        "loaded_gib": {precision: gib(count) for precision, count in plan.loaded_bytes.items()},
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
        "devices": [{"name": d.name, "gib": gib(d.bytes), "source": d.source} for d in plan.devices],
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


def _units_range(units: Sequence[str]) -> str:
    if not units:
        return "nothing"
    if len(units) == 1:
        return units[0]
    return f"{len(units)} units, {units[0]} .. {units[-1]}"


def _placement_lines(placement: Placement, several_devices: bool) -> list[str]:
    """One precision's placement: where its weights go and the setting that asks for it; on several devices, the
    units each holds."""
    where = ", ".join(f"{share.device} {size_text(share.weights_bytes)}" for share in placement.shares if share.units)
    if placement.unplaced_bytes:
        where += f"{', ' if where else ''}{size_text(placement.unplaced_bytes)} left over"
    setting = f"   {placement.setting}" if placement.setting else ""
    if placement.refused is not None:
        setting = f"   (not here: {placement.refused})"
    elif placement.precision in UNAVAILABLE:
        setting = f"   ({UNAVAILABLE[placement.precision]})"
    lines = [f"  {placement.precision:9s} {VERDICT_TEXT[placement.verdict]:22s} {where}{setting}"]
    if several_devices:
        lines += [f"      {share.device}: {_units_range(share.units)}" for share in placement.shares if share.units]
    return lines


def format_plan(plan: Plan) -> str:
    """The plan as text for a person."""
    spec = plan.spec
    bf16 = plan.requests["bfloat16"]
    names = {"routed_experts": "routed experts", "linear": "linear layers", "embedding": "embedding/LM head"}
    names |= {"vision": "vision tower", "other": "other"}
    vision_parameters = sum(weight.numel for weight in spec.weights if weight.kind == "vision" and not weight.buffer)
    lines = [
        f"{spec.architecture} in {spec.folder}: built on the meta device in {spec.build_s:.2f} s, no weights loaded",
        f"  parameters: {count_text(spec.parameters)} after the encoder/decoder tie "
        f"({count_text(spec.parameters_before_tie)} before)",
    ]
    if spec.stored.bytes is not None:
        lines.append(
            f"  stored: {spec.stored.dtype or 'unknown dtype'}, {size_text(spec.stored.bytes)} ({spec.stored.source})"
        )
    if spec.stored.missing:
        lines.append(
            f"  incomplete: {'; '.join(spec.stored.missing)}: the engine will not load this folder until they are there"
        )
    lines += [
        "  weights: " + ", ".join(f"{p} {size_text(plan.weights_bytes[p])}" for p in PRECISIONS),
        f"    loaded, text only: {size_text(plan.loaded_bytes['bfloat16'])} in bf16; the vision tower and its "
        f"embedder ({count_text(vision_parameters)} parameters, "
        f"{size_text(plan.weights_bytes['bfloat16'] - plan.loaded_bytes['bfloat16'])} in bf16) are never read: code "
        "completion sends no image",
        f"    quantized: {plan.quantized_share:.1%} of the parameters (routed experts and text linear layers); "
        f"int8 1 byte + 5 bytes per row, fp8 1 byte + 4 bytes per {FP8_BLOCK}x{FP8_BLOCK} block, int4 0.5 byte + a "
        f"bf16 scale per {INT4_GROUP_SIZE} weights; embedding/LM head, router, norms, biases and vision tower stay "
        "bf16",
        "  by kind: "
        + ", ".join(f"{names[kind]} {share:.1%}" for kind, share in plan.shares.items())
        + f" (nn.Linear anywhere: {plan.linear_anywhere_share:.1%})",
        f"  per request (canvas {bf16.canvas_length}, bf16 activations; float32 doubles the cache):",
        f"    prefix cache: {size_text(bf16.kv_bytes_per_token)} per prompt token "
        f"(sliding layers {size_text(bf16.kv_bytes_per_token_sliding)}, "
        f"full {size_text(bf16.kv_bytes_per_token_full)}); "
        f"{size_text(bf16.kv_prompt_bytes)} for {bf16.prompt_tokens} tokens with sliding layers at their window; "
        f"the engine keeps {size_text(bf16.kv_engine_document_bytes)} per document (every token on every layer, plus "
        f"the window's copy), for up to {PREFIX_CACHE_SLOTS} documents",
        f"    step: {bf16.step_tensors:g} x {size_text(bf16.step_tensor_bytes)} vocabulary-sized tensors = "
        f"{size_text(bf16.step_bytes)} per canvas row (serve --max-batch N runs N rows)",
        f"    kept free on the first device: {size_text(bf16.reserve_bytes)} for {bf16.rows} row(s)",
        "  devices: " + (", ".join(f"{d.name} {size_text(d.bytes)} ({d.source})" for d in plan.devices) or "none"),
    ]
    for placement in plan.placements:
        lines += _placement_lines(placement, several_devices=len(plan.devices) > 1)
    if plan.recommendation is None:
        lines.append("  use: nothing fits these devices")
    else:
        verdict = VERDICT_TEXT[plan.recommendation.verdict]
        lines.append(f"  use: {plan.recommendation.setting}  ({plan.recommendation.precision} {verdict})")
    return "\n".join(lines)
