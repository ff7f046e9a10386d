"""How much memory a checkpoint needs and where it would go, from its config alone: ``diffgemma-engine plan``.

The model is built on the meta device (shapes, no storage: 0.2 s for the 26B release) with its encoder and
decoder tied, as ``from_pretrained`` ties them, and described as a list of :class:`Weight` records; everything
after that is arithmetic on those records, pure and testable without torch:

* weights per precision: ``bfloat16`` and ``float32`` count every tensor at 2 or 4 bytes; ``int8`` stores the
  weights ``diffgemma_engine.loading.quantize_policy`` converts at 1 byte plus a float32 scale and an int8 zero point
  per output row (torchao's layout), ``fp8`` at 1 byte plus a float32 scale per ``FP8_BLOCK`` x ``FP8_BLOCK`` block
  (transformers' fine-grained fp8), ``int4`` at half a byte plus one bfloat16 scale per group of ``INT4_GROUP_SIZE``
  input weights, planned for its size only (``UNAVAILABLE``); what the policy keeps stays bfloat16;
* per request, at the model's canvas: the encoded prompt's keys and values and the denoising step's
  vocabulary-sized tensors (``STEP_VOCAB_TENSORS``);
* a placement per precision over the devices present or described (``--max-memory``), filled in order as
  accelerate's ``sequential`` device map fills them. Not by accelerate itself: its ``infer_auto_device_map``
  (1.15) fails on this model with an ``IndexError`` once it must split the encoder (every encoder weight is tied
  to a decoder weight, accelerate issues #958, #3308; transformers #46566), and transformers' own (5.24) skips the
  names ``named_parameters`` keeps for tied tensors and counts the tied 26B model as 1.1 GiB. Here the unit of
  placement is a no-split block (``model._no_split_modules``: a decoder layer, a vision layer) merged with every
  block it shares a tensor with: encoder layer *i* with decoder layer *i*, the three names of the embedding.

The package in the order a plan is made: :mod:`.records` (what a plan is made of), :mod:`.spec` (the checkpoint
on the meta device), :mod:`.devices` (where it could go), :mod:`.memory` (the arithmetic), :mod:`.report` (JSON
and text). Everything a caller uses is imported here.
"""

from __future__ import annotations

from .devices import (
    MEMINFO,
    cpu_memory,
    detect_devices,
    device_name,
    parse_max_memory,
    parse_size,
    select_devices,
    sort_devices,
)
from .memory import (
    CACHE_SHARE,
    STEP_SHARE,
    ServingLimits,
    activation_dtype,
    advice,
    engine_setting,
    kind_of,
    kind_shares,
    make_plan,
    place,
    placement_units,
    recommend,
    request_memory,
    serving_limits,
    text_weights,
    total_bytes,
    weight_bytes,
)
from .records import (
    CPU_PREFERENCE,
    DEFAULT_PROMPT_TOKENS,
    DOES_NOT_FIT,
    ELEMENT_BYTES,
    FITS_CPU,
    FITS_GPU,
    FITS_WITH_OFFLOAD,
    FP8_BLOCK,
    GIB,
    GPU_PREFERENCE,
    HALF_PRECISION_SAVING,
    INT4_GROUP_SIZE,
    INT8_ROW_BYTES,
    KINDS,
    MIB,
    OFFLOAD_PREFERENCE,
    PRECISIONS,
    PREFIX_CACHE_SLOTS,
    QUANTIZED,
    SCALE_BYTES,
    STEP_VOCAB_TENSORS,
    UNAVAILABLE,
    VERDICT_TEXT,
    AttentionLayer,
    Device,
    DeviceShare,
    ModelSpec,
    Placement,
    Plan,
    PlanError,
    RequestMemory,
    StoredCheckpoint,
    Weight,
    gib,
)
from .report import (
    format_plan,
    plan_json,
)
from .spec import (
    attention_layers,
    describe_model,
    read_spec,
    stored_checkpoint,
)

__all__ = [
    "AttentionLayer",
    "CACHE_SHARE",
    "CPU_PREFERENCE",
    "DEFAULT_PROMPT_TOKENS",
    "DOES_NOT_FIT",
    "Device",
    "DeviceShare",
    "ELEMENT_BYTES",
    "FITS_CPU",
    "FITS_GPU",
    "FITS_WITH_OFFLOAD",
    "FP8_BLOCK",
    "GIB",
    "GPU_PREFERENCE",
    "HALF_PRECISION_SAVING",
    "INT4_GROUP_SIZE",
    "INT8_ROW_BYTES",
    "KINDS",
    "MEMINFO",
    "MIB",
    "ModelSpec",
    "OFFLOAD_PREFERENCE",
    "PRECISIONS",
    "PREFIX_CACHE_SLOTS",
    "Placement",
    "Plan",
    "PlanError",
    "QUANTIZED",
    "RequestMemory",
    "SCALE_BYTES",
    "STEP_SHARE",
    "STEP_VOCAB_TENSORS",
    "ServingLimits",
    "StoredCheckpoint",
    "UNAVAILABLE",
    "VERDICT_TEXT",
    "Weight",
    "activation_dtype",
    "advice",
    "attention_layers",
    "cpu_memory",
    "describe_model",
    "detect_devices",
    "device_name",
    "engine_setting",
    "format_plan",
    "gib",
    "kind_of",
    "kind_shares",
    "make_plan",
    "parse_max_memory",
    "parse_size",
    "place",
    "placement_units",
    "plan_json",
    "read_spec",
    "recommend",
    "request_memory",
    "select_devices",
    "serving_limits",
    "sort_devices",
    "stored_checkpoint",
    "text_weights",
    "total_bytes",
    "weight_bytes",
]
