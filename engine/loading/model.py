"""Load a DiffusionGemma checkpoint from a local folder, with its tokenizer and denoising settings."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from ..canvas.caches import DEFAULT_SLOTS
from ..canvas.clock import StepClock, default_min_steps, floor_for
from ..canvas.runtime import execution_device, text_config_of
from ..canvas.sampler import SamplerSettings
from ..errors import ModelLoadError
from ..shared import protocol, socket_paths
from ..shared.prompt import CHAT_ORDERS, SUFFIX_FIRST, PromptLayout, layout_for
from . import hub, loadable, placement, plan, quantize, quantize_check, text_only
from .checkpoint_files import (
    DEFAULT_MODEL_DIR,  # noqa: F401 - the shipped model, which tests name from here
    HINTS_FILE,
    canvas_length_of,
    read_json_object,
    stored_dtype,
)
from .folder_limits import check_folder
from .generation_limits import check_generation
from .model_info import ModelInfo
from .serving import ServingState

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerBase
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_PROMPT_TOKENS = 1024


MAX_ROWS = 64
"""The most canvas rows one step runs, however much memory there is."""


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint's facts, fixed once loaded, and its model. What changes while it serves (:class:`ServingState`)
    is made the first time something serves with it (``serving``), not by the loader."""

    model: DiffusionGemmaForBlockDiffusion
    tokenizer: PreTrainedTokenizerBase
    model_id: str
    device: torch.device
    layout: PromptLayout
    """The checkpoint's prompt strategy (FIM sentinels, or an instruction in its chat template)."""
    eos_ids: set[int]
    pad_id: int | None
    canvas_length: int
    sampler: SamplerSettings
    max_prompt_tokens: int
    load_ms: float
    line_canvas_length: int | None = None
    """The canvas for ``scope = "line"`` requests (None: the model's own canvas)."""
    min_steps: int = 0
    """The fewest of the schedule's ``sampler.max_steps`` steps a deadline leaves a completion (its answer means
    nothing below it): ``diffgemma.json`` ``min_steps``, else ``diffgemma_engine.canvas.clock.default_min_steps``; 0:
    that default."""
    quantized: quantize_check.QuantizedReport | None = None
    """What a quantized load converted and saved (None: not quantized)."""
    max_rows: int = MAX_ROWS
    """Canvas rows denoised together (batched requests, or a request's candidates) that the memory left after
    loading allows (``diffgemma_engine.loading.plan.serving_limits``)."""
    cache_slots: int = 0
    """Encoded prompts the memory left after loading can keep (0: no prefix cache)."""
    clock: StepClock = field(default_factory=StepClock, compare=False)
    """Step times measured so far, from which a deadline becomes a step budget (every runtime's, and the serving
    state's)."""

    def __post_init__(self) -> None:
        # frozen: the derived field is set once, here
        floor = min(self.min_steps or default_min_steps(self.sampler.max_steps), self.sampler.max_steps)
        object.__setattr__(self, "min_steps", floor)

    @functools.cached_property
    def serving(self) -> ServingState:
        """What changes while the model serves, made on first use: its step, its prefix cache, its clock."""
        return ServingState.of(self.model, self.cache_slots, self.clock)

    def step_floor(self, steps: int) -> int:
        """The fewest steps a deadline leaves a schedule of ``steps`` (``diffgemma_engine.canvas.clock.floor_for``)."""
        return floor_for(steps, self.min_steps, self.sampler.max_steps)

    def info(self) -> ModelInfo:
        """What the socket side reports of this model (``diffgemma_engine.loading.model_info``); the step's state is
        read live."""
        return ModelInfo(
            model_id=self.model_id,
            device=str(self.device),
            load_ms=self.load_ms,
            canvas_length=self.canvas_length,
            max_prompt_tokens=self.max_prompt_tokens,
            layout=self.layout.name,
            max_steps=self.sampler.max_steps,
            min_steps=self.min_steps,
            compile_state=lambda: self.serving.step_state(),  # read live; made only when asked
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)  # Any: an untyped decorator wraps it
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens dropped."""
        return decode_text(self.tokenizer, ids, skip_special_tokens=True)

    def decode_prompt(self, ids: list[int]) -> str:
        """Text of prompt ``ids`` with its control tokens, as the model saw them."""
        return decode_text(self.tokenizer, ids, skip_special_tokens=False)


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: list[int], *, skip_special_tokens: bool) -> str:
    """``tokenizer.decode`` of one sequence of ids: one string (transformers types the result as a string or the
    list of strings a batch of sequences decodes to)."""
    text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    if not isinstance(text, str):
        raise TypeError(f"decoding one sequence of ids gave a {type(text).__name__}, not a str")
    return text


HINT_RANGES = {
    "max_prompt_tokens": (16, 1 << 20),
    "line_canvas_length": (1, protocol.MAX_CANVAS_LENGTH),
    "min_steps": (1, protocol.MAX_STEPS),
}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""A checkpoint's tokenizer is one of these (fast, SentencePiece, byte-level BPE with its merges)."""


def read_hints(folder: Path) -> dict[str, Any]:
    """The checkpoint's ``diffgemma.json``, checked: numbers in range, a known ``chat_order``; ``ModelLoadError``
    naming the bad key otherwise (a bad hint would make every completion fail later, unseen)."""
    path = folder / HINTS_FILE
    if not path.is_file():
        return {}
    hints = read_json_object(path)
    for key, (low, high) in HINT_RANGES.items():
        value = hints.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise ModelLoadError(f"{path}: {key} must be a whole number from {low} to {high}, got {value!r}")
    if hints.get("chat_order", SUFFIX_FIRST) not in CHAT_ORDERS:
        raise ModelLoadError(f"{path}: chat_order must be one of {', '.join(CHAT_ORDERS)}, got {hints['chat_order']!r}")
    return hints


def _advice(folder: Path, devices: placement.Devices, dtype: torch.dtype) -> str:
    """The memory plan's advice for ``folder`` on this machine, for a load that ran out of memory."""
    try:
        found = plan.detect_devices()
        chosen = [device for device in found if device.name in devices.names or device.name == "cpu"]
        advised = plan.make_plan(plan.read_spec(folder), chosen, env=loadable.environment())
        return plan.advice(advised, placement.precision_of(dtype))
    except Exception as exc:  # noqa: BLE001 - the advice must not hide the load's own error
        return f"(no memory plan: {exc})"


def _placed(where: dict[str, str]) -> str:
    """How many device-map entries went to each device, for the log."""
    counts: dict[str, int] = {}
    for device in where.values():
        counts[device] = counts.get(device, 0) + 1
    return ", ".join(f"{device}: {count} blocks" for device, count in counts.items())


def _load_name(folder: Path, model_id: str) -> str:
    """How the load's log line names the model: ``default`` (not the engine's install path), the folder, or the folder
    with the hub id it was pulled as."""
    if model_id == socket_paths.SHIPPED_MODEL_ID or model_id == str(folder.resolve()):
        return model_id
    return f"{folder} ({model_id})"


def load_model(
    model_dir: str | Path | None,
    device: str | None = None,
    dtype: str | None = None,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    max_memory: str | None = None,
    offload_folder: Path | None = None,
    quantization: str | None = None,
) -> LoadedModel:
    """Load ``model_dir`` (the shipped default model when None) straight onto ``device``
    (``diffgemma_engine.loading.placement``: one device, or several with ``max_memory`` bytes each, ``disk`` offload
    into ``offload_folder``); a hub id is its cached snapshot (``diffgemma_engine.loading.hub``). ``quantization``
    (``diffgemma_engine.loading.quantize``): none, int8, fp8, or None for the checkpoint's own; a quantized load is
    checked right after it (experts converted, encoder and decoder one copy, smaller)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated

    folder = hub.checkpoint_folder(model_dir)  # a hub id's cached snapshot; every weight file whole
    config, hints = _checked_folder(folder)
    start = time.perf_counter()
    devices = placement.pick_devices(device)
    torch_dtype = placement.pick_dtype(dtype, stored_dtype(config), devices.first)
    settings = quantize.load_settings(quantization, devices.names, folder)  # refused here, before any weight
    precision = settings.method if settings.method != "none" else placement.precision_of(torch_dtype)
    if devices.single and devices.first != "cpu":  # an accelerator: refused at once rather than out of memory later
        free = placement.free_bytes(torch.device(devices.first))
        placement.check_fits(folder, devices.first, torch_dtype, free, precision)
    where = placement.device_map(folder, devices, torch_dtype, placement.parse_max_memory(max_memory), precision)
    kwargs = placement.load_kwargs(where, offload_folder, **settings.kwargs)
    tokenizer, model = _read_checkpoint(folder, devices, torch_dtype, kwargs)
    quantized = None
    if settings.method != "none":
        quantize.finish_load(model, settings.method, pre_quantized=settings.pre_quantized)
        quantized = quantize_check.verify_quantized(model, settings.method)
        logger.info("%s", quantized.summary())
    torch_device = execution_device(model)  # the map's first accelerator: where inputs and caches go
    max_prompt_tokens = min(max_prompt_tokens, hints.get("max_prompt_tokens", max_prompt_tokens))
    limits = serving_limits(model, torch_device, torch_dtype, max_prompt_tokens)
    loaded = _assemble(
        folder,
        model_dir,
        tokenizer,
        model,
        hints,
        max_prompt_tokens,
        start,
        device=torch_device,
        cache_slots=limits.cache_slots,
        max_rows=limits.rows,
        quantized=quantized,
    )
    _log_load(loaded, folder, devices if devices.single else f"{devices} ({_placed(where)})", torch_dtype)
    logger.info("memory left after loading: up to %d cached prompts, %d canvas rows at once", *attrs.astuple(limits))
    return loaded


def _log_load(loaded: LoadedModel, folder: Path, where: object, dtype: torch.dtype) -> None:
    """The load's log line: what was loaded, where, and how it will be prompted and denoised."""
    logger.info(
        "loaded %s on %s (%s, layout %s, canvas %d, %d steps, at least %d under a deadline) in %.0f ms",
        _load_name(folder, loaded.model_id),
        where,
        dtype,
        loaded.layout.name.value,
        loaded.canvas_length,
        loaded.sampler.max_steps,
        loaded.min_steps,
        loaded.load_ms,
    )


def load_facts(model_dir: str | Path | None, max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS) -> LoadedModel:
    """What a runtime that holds the weights elsewhere (``serve --runtime vllm``) needs of a checkpoint: its
    tokenizer, config, schedule, end ids, prompt layout and hints, checked as ``load_model`` checks them, with the
    model built on the meta device: no weight is read, placed or kept (the release's 52 GB stay with vLLM)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion

    folder = hub.checkpoint_folder(model_dir)
    _, hints = _checked_folder(folder)
    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):
            model = DiffusionGemmaForBlockDiffusion(config)
        model.generation_config = type(model).generation_config_class.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the checkpoint in {folder}: {exc}") from exc
    max_prompt_tokens = min(max_prompt_tokens, hints.get("max_prompt_tokens", max_prompt_tokens))
    # the CPU: where a rewrite's start canvas is renoised (``request.canvas_ask``); nothing runs on the meta model
    loaded = _assemble(folder, model_dir, tokenizer, model, hints, max_prompt_tokens, start, device=torch.device("cpu"))
    logger.info(
        "read %s: tokenizer, config and schedule, no weights (layout %s, canvas %d, %d steps)",
        _load_name(folder, loaded.model_id),
        loaded.layout.name.value,
        loaded.canvas_length,
        loaded.sampler.max_steps,
    )
    return loaded


def _assemble(
    folder: Path,
    model_dir: str | Path | None,
    tokenizer: PreTrainedTokenizerBase,
    model: DiffusionGemmaForBlockDiffusion,
    hints: dict[str, Any],
    max_prompt_tokens: int,
    start: float,
    device: torch.device,
    cache_slots: int = 0,
    max_rows: int = 1,
    quantized: quantize_check.QuantizedReport | None = None,
) -> LoadedModel:
    """The ``LoadedModel`` of a checkpoint read from ``folder``, with inputs going to ``device``: its schedule and
    end ids checked, its prompt layout, its hints."""
    eos_ids, pad_id, sampler = _generation_of(model, tokenizer)
    line_canvas_length = hints.get("line_canvas_length")
    try:
        layout = layout_for(tokenizer, chat_order=hints.get("chat_order", SUFFIX_FIRST))
    except ValueError as exc:  # no FIM tokens and no usable chat template
        raise ModelLoadError(f"cannot lay out prompts for the checkpoint in {folder}: {exc}") from exc
    model_id = socket_paths.model_identity(str(model_dir)) if model_dir is not None else socket_paths.SHIPPED_MODEL_ID
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        device=device,
        layout=layout,
        eos_ids=eos_ids,
        pad_id=pad_id,
        canvas_length=canvas_length_of(model.config),
        sampler=sampler,
        max_prompt_tokens=max_prompt_tokens,
        load_ms=(time.perf_counter() - start) * 1000.0,
        line_canvas_length=int(line_canvas_length) if line_canvas_length else None,
        min_steps=int(hints.get("min_steps", 0)),
        max_rows=max_rows,
        cache_slots=cache_slots,
        quantized=quantized,
    )


def _generation_of(
    model: DiffusionGemmaForBlockDiffusion, tokenizer: PreTrainedTokenizerBase
) -> tuple[set[int], int | None, SamplerSettings]:
    """The checkpoint's end-of-sequence ids, padding id and schedule, checked against the engine's caps (a setting
    past them would refuse every request later, unseen)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    generation = model.generation_config
    assert isinstance(generation, DiffusionGemmaGenerationConfig)  # from_pretrained loads generation_config_class
    eos = generation.eos_token_id if generation.eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    sampler = sampler_settings_of(generation)
    pad_id = generation.pad_token_id if generation.pad_token_id is not None else tokenizer.pad_token_id
    check_generation(
        dataclasses.asdict(sampler),
        eos_ids=eos_ids,
        pad_id=pad_id,
        vocab_size=text_config_of(model.config).vocab_size,
        tokenizer_size=len(tokenizer),
        canvas_length=canvas_length_of(model.config),
    )
    return eos_ids, pad_id, sampler


def _checked_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and the engine's hints of ``folder``, before any weight is read: every file within its cap and
    the config's sizes bounded, a bad hint refused in milliseconds, a tokenizer present."""
    config = check_folder(folder)
    hints = read_hints(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"no tokenizer in {folder}: it needs {' or '.join(TOKENIZER_FILES)} (copy the tokenizer files "
            "that came with the checkpoint)"
        )
    return config, hints


def _read_checkpoint(
    folder: Path, devices: placement.Devices, torch_dtype: torch.dtype, kwargs: dict[str, Any]
) -> tuple[PreTrainedTokenizerBase, DiffusionGemmaForBlockDiffusion]:
    """The tokenizer and the model, text only (``diffgemma_engine.loading.text_only``), in eval mode; out of memory, the
    plan's advice; a file transformers cannot read, ``ModelLoadError``."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = text_only.from_pretrained(folder, dtype=torch_dtype, local_files_only=True, **kwargs)
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(
            f"out of memory loading {folder} onto {devices}: {exc}; {_advice(folder, devices, torch_dtype)}"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the checkpoint in {folder}: {exc}") from exc
    model.train(False)  # model.eval(), which transformers leaves unannotated
    return tokenizer, model


def sampler_settings_of(generation: DiffusionGemmaGenerationConfig) -> SamplerSettings:
    """The checkpoint's own schedule (``generation_config.json``), the engine's defaults where it says nothing."""
    defaults = SamplerSettings()
    return SamplerSettings(
        max_steps=generation.max_denoising_steps or defaults.max_steps,
        t_min=generation.t_min if generation.t_min is not None else defaults.t_min,
        t_max=generation.t_max if generation.t_max is not None else defaults.t_max,
        entropy_bound=getattr(generation.sampler_config, "entropy_bound", defaults.entropy_bound),
        stability_threshold=(
            generation.stability_threshold
            if generation.stability_threshold is not None
            else defaults.stability_threshold
        ),
        confidence_threshold=generation.confidence_threshold or defaults.confidence_threshold,
    )


def serving_limits(
    model: DiffusionGemmaForBlockDiffusion, device: torch.device, dtype: torch.dtype, prompt_tokens: int
) -> plan.ServingLimits:
    """Cached prompts and step rows that fit in the memory left on ``device``
    (``diffgemma_engine.loading.plan.serving_limits``)."""
    config = model.config
    request = plan.request_memory(
        plan.attention_layers(config),
        canvas_length=canvas_length_of(config),
        vocab_size=text_config_of(config).vocab_size,
        prompt_tokens=prompt_tokens,
        dtype="float32" if dtype == torch.float32 else "bfloat16",
    )
    return plan.serving_limits(placement.free_bytes(device), request, max_slots=DEFAULT_SLOTS, max_rows=MAX_ROWS)
