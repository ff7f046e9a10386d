"""Where the engine puts a checkpoint: the devices ``--device`` names, the dtype, and the device map handed to
``from_pretrained``, so that every weight is read from its file straight onto the device it runs on (no CPU
staging, no ``.to()`` after loading).

* One device (``cpu``, ``mps``, ``cuda:0``): ``device_map={"": device}``.
* Several (``cuda:0,1``; ``cuda:0,cpu`` to offload to RAM; ``cpu,disk`` to offload to disk): the memory plan's
  placement (``diffgemma_engine.loading.plan``) as an explicit map, tied encoder/decoder layers together (the vision
  tower is not loaded at all: ``diffgemma_engine.loading.text_only``); accelerate's hooks move the activations from
  device to device. Not ``device_map="auto"``: accelerate's ``infer_auto_device_map`` fails on this model as soon as it
  must split it (see ``diffgemma_engine.loading.plan``).

``auto`` picks CUDA (every visible GPU, filled in order), then MPS, then the CPU. The ``auto`` dtype is the
checkpoint's own on every device (float16 on a CPU becomes float32, which CPUs compute far faster).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ..canvas.runtime import DISK
from ..errors import ModelLoadError
from .loadable import environment

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")


@attrs.frozen
class Devices:
    """The devices a model is spread over, in the order they are filled; ``disk`` (offload) only last."""

    names: tuple[str, ...]

    @property
    def first(self) -> str:
        """Where the model's inputs go (its embedding's device)."""
        return self.names[0]

    @property
    def single(self) -> bool:
        return len(self.names) == 1

    def __str__(self) -> str:
        return ",".join(self.names)


def parse_devices(spec: str | None, cuda_count: int, mps: bool) -> Devices:
    """The devices ``spec`` names on a machine with ``cuda_count`` GPUs and (or not) MPS: ``auto``, ``cpu``,
    ``mps``, ``cuda`` (the first GPU), ``cuda:N``, ``cuda:0,1``, ``cuda:0,cpu``, ``cuda:0,cpu,disk``, ``cpu,disk``.
    ``ModelLoadError`` says what is wrong with a spec this machine cannot serve."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        if cuda_count:
            return Devices(tuple(f"cuda:{index}" for index in range(cuda_count)))
        return Devices(("mps",) if mps else ("cpu",))
    names: list[str] = []
    for item in (part.strip() for part in spec.split(",")):
        if item.isdigit() and names and names[-1].startswith("cuda:"):
            item = f"cuda:{item}"  # cuda:0,1
        if item == "cuda":
            item = "cuda:0"
        if item.startswith("cuda:") and item[5:].isdigit():
            if int(item[5:]) >= cuda_count:
                found = f"{cuda_count} CUDA device(s)" if cuda_count else "no CUDA device (or a CPU-only torch)"
                raise ModelLoadError(f"--device {spec}: there is no {item} here ({found})")
        elif item == "mps":
            if not mps:
                raise ModelLoadError(f"--device {spec}: MPS is not available here (it needs Apple silicon)")
        elif item not in ("cpu", DISK):
            raise ModelLoadError(
                f"--device {spec}: unknown device {item!r}; use auto, cpu, mps, cuda, cuda:N, cuda:0,1 or "
                "add cpu / disk after the GPUs to offload"
            )
        if item in names:
            raise ModelLoadError(f"--device {spec} names {item} twice")
        names.append(item)
    if not names or names[0] == DISK or (DISK in names and names[-1] != DISK):
        raise ModelLoadError(f"--device {spec}: disk can only come last, after the devices that run the model")
    return Devices(tuple(names))


def pick_devices(spec: str | None) -> Devices:
    """``parse_devices`` on this machine."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return parse_devices(spec, torch.cuda.device_count(), bool(mps is not None and mps.is_available()))


def pick_dtype(name: str | None, stored: torch.dtype | str | None, device: str) -> torch.dtype:
    """``auto`` (or None): the checkpoint's own dtype (``stored``, from its config; float32 when it says none),
    except float16 on a CPU, which becomes float32. Otherwise the dtype named."""
    import torch

    if name in (None, "auto"):
        dtype = getattr(torch, stored) if isinstance(stored, str) else stored
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            return torch.float32
        return torch.float32 if dtype == torch.float16 and device == "cpu" else dtype
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    named: torch.dtype = getattr(torch, name)  # one of DTYPES
    return named


def device_map(
    folder: Path,
    devices: Devices,
    dtype: torch.dtype,
    max_memory: Mapping[str, int] | None = None,
    precision: str | None = None,
) -> dict[str, str]:
    """The ``device_map`` for ``from_pretrained``: everything on the one device, or the plan's placement over
    several (``max_memory``: bytes per device, else what each has free), the units left over on ``disk`` when it
    is named. ``ModelLoadError`` when the model does not fit, with the plan's figures."""
    if devices.single:
        return {"": devices.first}
    from . import plan

    spec = plan.read_spec(folder)
    precision = precision or precision_of(dtype)
    present = {device.name: device for device in plan.detect_devices()}
    chosen: list[plan.Device] = []
    for name in devices.names:
        if name == DISK:
            continue
        if max_memory is not None and name in max_memory:
            chosen.append(plan.Device(name=name, bytes=int(max_memory[name]), source="--max-memory"))
        elif name in present:
            chosen.append(present[name])
        else:
            raise ModelLoadError(f"--device {devices}: {name} is not present here")
    request = plan.request_memory(
        spec.attention,
        canvas_length=spec.canvas_length,
        vocab_size=spec.vocab_size,
        prompt_tokens=plan.DEFAULT_PROMPT_TOKENS,
        dtype=plan.activation_dtype(precision),
    )
    units = plan.placement_units(plan.text_weights(spec.weights), precision)  # the vision tower is not loaded
    placement = plan.place(units, chosen, precision, request.reserve_bytes)
    where = {unit: share.device for share in placement.shares for unit in share.units}
    left = [unit for unit, _ in units if unit not in where]
    if left and DISK not in devices.names:
        needed = sum(size for unit, size in units if unit in left)
        raise ModelLoadError(
            f"the model does not fit on {devices}: {needed / plan.GIB:.1f} GiB of {precision} weights have no "
            f"room (see diffgemma-engine plan --model {folder}); add cpu or disk to --device, or quantize"
        )
    where.update(dict.fromkeys(left, DISK))
    # Kept where the inputs are, never offloaded: buffers alone (rotary frequencies, a few KB, some not saved with
    # the weights), and the embedding tied to the LM head, which the decoder also reads outside its module's own
    # forward (self-conditioning: softmax(logits) @ embed_tokens.weight), where accelerate's hook would not load it.
    holds_parameters = {weight.unit for weight in spec.weights if not weight.buffer}
    pinned = {unit for unit in where if unit not in holds_parameters}
    pinned |= {weight.unit for weight in spec.weights if weight.kind == "embedding"}
    where.update(dict.fromkeys(pinned, devices.first))
    return {key: where[unit] for key, unit in spec.members if unit in where}  # no key for the vision tower


PLACEMENT_KEYS: tuple[str, ...] = ("device_map", "max_memory", "offload_folder", "offload_buffers")
"""``from_pretrained``'s arguments that say where weights go: :func:`load_kwargs` alone sets them."""


def load_kwargs(where: Mapping[str, str], offload_folder: Path | None, **others: Any) -> dict[str, Any]:
    """``from_pretrained``'s keyword arguments for a load placed by ``where`` (:func:`device_map`), with the
    ``offload_folder`` when anything goes to ``disk`` (a fresh temporary folder when None), merged with ``others``
    (a quantization's, ``diffgemma_engine.loading.quantize.from_pretrained_kwargs``). The one place the placement is
    built: ``ModelLoadError`` when ``others`` sets any of :data:`PLACEMENT_KEYS` (a quantizer and a device map cannot
    both say where the weights go)."""
    clash = sorted(set(others) & set(PLACEMENT_KEYS))
    if clash:
        raise ModelLoadError(f"the placement is the device map's alone, but the load's options also set {clash}")
    placed: dict[str, Any] = {"device_map": dict(where)}
    if DISK in where.values():
        placed["offload_folder"] = str(offload_folder or Path(tempfile.mkdtemp(prefix="diffgemma-offload-")))
    return {**placed, **others}


def free_bytes(device: torch.device) -> int:
    """Memory still free on ``device`` (CUDA: the driver's count; MPS: its recommended limit less what it holds;
    the CPU: ``MemAvailable``)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "mps":
        return max(0, int(torch.mps.recommended_max_memory()) - int(torch.mps.driver_allocated_memory()))
    from . import plan

    return plan.cpu_memory().bytes


def precision_of(dtype: torch.dtype) -> str:
    """The plan's name for the weights' precision at ``dtype`` (float16 takes the bytes bfloat16 does)."""
    return "float32" if str(dtype) == "torch.float32" else "bfloat16"


def check_fits(folder: Path, device: str, dtype: torch.dtype, free: int, precision: str | None = None) -> None:
    """Before loading onto one accelerator: ``ModelLoadError`` with the plan's advice when the weights and one
    request do not fit in its ``free`` bytes (a load that would run out of memory after minutes of reading)."""
    from . import plan

    spec = plan.read_spec(folder)
    precision = precision or precision_of(dtype)
    alone = plan.make_plan(spec, [plan.Device(name=device, bytes=free, source="free")], precisions=(precision,))
    if alone.placements[0].verdict == plan.FITS_GPU:
        return
    around = [plan.Device(name=device, bytes=free, source="free"), plan.cpu_memory()]
    advised = plan.make_plan(spec, around, env=environment())
    raise ModelLoadError(f"the model does not fit on {device}: {plan.advice(advised, precision)}")


def parse_max_memory(spec: str | None) -> dict[str, int] | None:
    """``--max-memory cuda:0=20GiB,cpu=48GiB`` as bytes per device name (as ``diffgemma_engine.loading.plan``
    reads it)."""
    if not spec:
        return None
    from . import plan

    try:
        return {device.name: device.bytes for device in plan.parse_max_memory(spec)}
    except plan.PlanError as exc:
        raise ModelLoadError(str(exc)) from None
