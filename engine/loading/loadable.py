"""Which precision can load on which devices here, and why not: one statement of the rules, for the loader
(``diffgemma_engine.loading.quantize.load_settings``), the memory plan's settings and advice
(``diffgemma_engine.loading.plan``) and ``doctor``.

:func:`refusal` is pure: it reads an :class:`Environment` (the packages installed, the hub's reach, each CUDA
device's compute capability) that :func:`environment` gathers from this machine, or that a caller describes (the
README's machine table). The rules, from transformers 5.24's quantizers and torchao 0.18:

* ``bfloat16``, ``float16``, ``float32``: every device.
* ``int8`` (torchao's ``Int8Tensor``): the CPU and CUDA devices, offload to the CPU or disk included; not MPS
  (torchao's int8 layout has no MPS kernels). Needs torchao 0.18.
* ``fp8`` (transformers' ``FineGrainedFP8``): only CUDA devices of compute capability 8.9 or later (below it
  transformers quietly loads bfloat16), no ``cpu`` or ``disk`` in the device map (transformers refuses them when it
  quantizes on the fly), the ``kernels`` package in transformers' range (``KERNELS_MIN_VERSION`` 0.18.2 to
  ``KERNELS_MAX_VERSION``), hub kernels enabled (``USE_HUB_KERNELS``), and its Triton kernel
  (``kernels-community/finegrained-fp8``), which the first step fetches from the hub: with the engine offline
  (``HF_HUB_OFFLINE=1``, its default) it must be in the local hub cache already.
* ``int4``: nowhere (``diffgemma_engine.loading.quantize.INT4_UNAVAILABLE``).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

TORCHAO_SERIES = "0.18"
TORCHAO_INSTALL = 'pip install "torchao==0.18.0"'
FP8_MIN_CAPABILITY = (8, 9)
FP8_KERNEL_REPO = "kernels-community/finegrained-fp8"
"""transformers' ``_HUB_KERNEL_MAPPING["finegrained-fp8"]`` (5.24), at its ``version`` :data:`FP8_KERNEL_VERSION`."""
FP8_KERNEL_VERSION = 4
KERNELS_RANGE = ("0.18.2", "0.19.0")
"""transformers' ``KERNELS_MIN_VERSION`` and ``KERNELS_MAX_VERSION`` (5.24), read from it when it is installed."""
INT4_REFUSAL = "int4 is not available in the engine: torchao 0.18 has no int4 layout that runs the fused experts"
TRUE = ("1", "on", "yes", "true")


@attrs.frozen(kw_only=True)
class Environment:
    """What the rules read about a machine."""

    torchao: str | None
    """torchao's installed version (None: not installed)."""
    kernels: str | None
    """The ``kernels`` package's installed version (None: not installed)."""
    kernels_range: tuple[str, str] = KERNELS_RANGE
    hub_kernels: bool = True
    """transformers may load hub kernels (``USE_HUB_KERNELS`` not off)."""
    offline: bool = True
    """The hub is not reached (``HF_HUB_OFFLINE``; the engine sets it unless told otherwise)."""
    fp8_kernel_cached: bool = False
    """The fp8 kernel is in the local hub cache."""
    capabilities: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)
    """Each CUDA device's compute capability, by name (``cuda:0``); a device not listed is not known."""


def _version_tuple(text: str) -> tuple[int, ...]:
    """``0.18.2`` as (0, 18, 2); a part's leading digits only (``0.19.0rc1`` -> (0, 19, 0)), up to the first part
    without any."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = len(piece) - len(piece.lstrip("0123456789"))
        if not digits:
            break
        parts.append(int(piece[:digits]))
    return tuple(parts)


def _in_range(version: str, low: str, high: str) -> bool:
    return _version_tuple(low) <= _version_tuple(version) < _version_tuple(high)


def refusal(precision: str, devices: Sequence[str], env: Environment) -> str | None:
    """Why ``precision`` cannot load on ``devices`` (``cuda:0``, ``mps``, ``cpu``, ``disk``: a device map's
    values) in ``env``, with what to use instead; None when it can."""
    if precision in ("bfloat16", "float16", "float32", "none"):
        return None
    if precision == "int4":
        return f"{INT4_REFUSAL}; use --quantization int8"
    if precision == "int8":
        elsewhere = sorted({name for name in devices if name not in ("cpu", "disk") and not name.startswith("cuda")})
        if elsewhere:
            return (
                f"int8 (torchao) runs on the CPU and CUDA, not on {', '.join(elsewhere)}: load bfloat16 there "
                "(leave --quantization out), offloading what does not fit with ,cpu"
            )
        if env.torchao is None:
            return f"int8 quantization needs torchao, which is not installed: {TORCHAO_INSTALL}"
        if not (env.torchao == TORCHAO_SERIES or env.torchao.startswith(TORCHAO_SERIES + ".")):
            return (
                f"torchao {env.torchao} is installed; the engine's int8 loading is written against {TORCHAO_SERIES} "
                f"(its tensor types' operators change between releases): {TORCHAO_INSTALL}"
            )
        return None
    if precision == "fp8":
        return _fp8_refusal(devices, env)
    return f"unknown precision {precision!r}"


def _fp8_refusal(devices: Sequence[str], env: Environment) -> str | None:
    need = ".".join(map(str, FP8_MIN_CAPABILITY))
    gpus = [name for name in devices if name.startswith("cuda")]
    others = sorted({name for name in devices if not name.startswith("cuda")})
    if not gpus:
        return (
            f"fp8 needs a CUDA GPU of compute capability {need} or later (Ada, Hopper, Blackwell), not "
            f"{', '.join(others) or 'no device'}: use --quantization int8 on the CPU, bfloat16 on mps"
        )
    if others:
        return (
            f"fp8 quantizes on the GPU as the weights are read, and transformers refuses {' or '.join(others)} in "
            "its device map then: use --quantization int8 to offload"
        )
    for name in gpus:
        capability = env.capabilities.get(name)
        if capability is None:
            return f"fp8 needs compute capability {need} or later, and {name}'s is not known here: use int8"
        if tuple(capability) < FP8_MIN_CAPABILITY:
            return (
                f"fp8 needs CUDA compute capability {need} or later; {name} has {'.'.join(map(str, capability))} "
                "(transformers would quietly load bfloat16 instead): use --quantization int8"
            )
    low, high = env.kernels_range
    if env.kernels is None or not _in_range(env.kernels, low, high):
        found = f"kernels {env.kernels} is installed" if env.kernels else "the kernels package is not installed"
        return (
            f"fp8 runs transformers' Triton kernel through the kernels package ({low} <= version < {high}); "
            f'{found}: pip install "kernels>={low},<{high}", or use --quantization int8'
        )
    if not env.hub_kernels:
        return "fp8 needs transformers' hub kernels, which USE_HUB_KERNELS turns off: unset it, or use int8"
    if env.offline and not env.fp8_kernel_cached:
        return (
            f"fp8's kernel ({FP8_KERNEL_REPO}, v{FP8_KERNEL_VERSION}) is fetched from the hub at the first step, and "
            "the engine runs offline (HF_HUB_OFFLINE=1) with no copy in the hub cache: fetch it once with "
            f"python -c \"from kernels import get_kernel; get_kernel('{FP8_KERNEL_REPO}', "
            f'version={FP8_KERNEL_VERSION})", or use --quantization int8'
        )
    return None


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _kernel_cached(repo_id: str, version: int) -> bool:
    """The hub cache holds the branch ``v{version}`` of ``repo_id`` (as the kernels package fetches it)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    return (folder / "refs" / f"v{version}").is_file()


def environment() -> Environment:
    """This machine's :class:`Environment`: installed packages, the hub's reach, the CUDA devices' capabilities."""
    import torch

    capabilities: dict[str, tuple[int, int]] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            capabilities[f"cuda:{index}"] = (int(major), int(minor))
    kernels_range = KERNELS_RANGE
    try:
        from transformers.utils import import_utils

        kernels_range = (str(import_utils.KERNELS_MIN_VERSION), str(import_utils.KERNELS_MAX_VERSION))
    except (ImportError, AttributeError):
        pass
    return Environment(
        torchao=installed("torchao"),
        kernels=installed("kernels"),
        kernels_range=kernels_range,
        hub_kernels=os.environ.get("USE_HUB_KERNELS", "YES").strip().lower() in TRUE,
        offline=os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() in TRUE,
        fp8_kernel_cached=_kernel_cached(FP8_KERNEL_REPO, FP8_KERNEL_VERSION),
        capabilities=capabilities,
    )
