"""The plan's records and constants: a checkpoint's weights and attention, devices, placements, the plan."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from ...shared.units import GIB as GIB
from ...shared.units import MIB as MIB
from ..quantize_policy import stays_unquantized

if TYPE_CHECKING:
    pass


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
``diffgemma_engine.canvas.sampler.draw_tokens`` turns into their cumulative distribution in place. The entropy is taken
without log-probabilities and the previous step's logits are let go once the decoder has read them
(``diffgemma_engine.canvas.step.StepState.take_self_conditioning``; it was 5 before). Measured with a dispatch-mode
tracker on the small checkpoints (``tests/engine/test_plan.py``); ``exact`` sampling holds more."""
HALF_PRECISION_SAVING = 0.5
"""A bfloat16 model's logits, kept for self-conditioning, are half a float32 tensor (the scores are float32)."""
DEFAULT_PROMPT_TOKENS = 2048
PREFIX_CACHE_SLOTS = 16
"""Documents whose encoded prompt the engine keeps (``diffgemma_engine.canvas.caches.DEFAULT_SLOTS``)."""
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
"""Precisions planned for their size but never recommended: the engine cannot load them
(``diffgemma_engine.loading.quantize``)."""
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
"""transformers' fine-grained fp8 on the release: a float32 scale per 64 x 64 block
(``diffgemma_engine.loading.quantize``)."""


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
        """Converted by a quantizer (``diffgemma_engine.loading.quantize_policy``); buffers never are."""
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
    """Weight files the folder names that are missing or cut short (``diffgemma_engine.loading.shards``): the engine
    refuses to load it until they are there."""


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
    """Why the loader would refuse this precision on the devices it uses
    (``diffgemma_engine.loading.loadable.refusal``)."""

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


def gib(count: float) -> float:
    """``count`` bytes in GiB, to three places (the JSON's unit)."""
    return round(count / GIB, 3)
